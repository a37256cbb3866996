"""An example Celery project using celery-redisdelay; ``python3 dev.py demo`` runs its demo."""
