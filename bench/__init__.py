"""Benchmarks of celery-redisdelay against Celery's own countdown; run them with ``python -m bench``."""
