"""A minimal Django project with Celery and celery-redisdelay, as the README's Django section sets it up."""
