"""Django settings: sqlite, and Celery's settings under the ``CELERY_`` namespace (ours included)."""

import os

SECRET_KEY = "not-a-secret: tests only"
INSTALLED_APPS: list[str] = []
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("DJANGO_TEST_DB", ":memory:")}}
USE_TZ = True

_URL = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")
CELERY_BROKER_URL = f"{_URL}/7"
CELERY_RESULT_BACKEND = f"{_URL}/8"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_REDISDELAY_KEY_PREFIX = "django"
CELERY_REDISDELAY_TICK_INTERVAL = 0.2
