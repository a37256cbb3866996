"""The project's Celery app (Django's usual ``proj/celery.py``), with celery-redisdelay."""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

from celery_redisdelay import RedisDelay

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_proj.settings")

app = Celery("django_proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
rd = RedisDelay(app)
marks = redis.Redis.from_url(f"{os.environ.get('REDISDELAY_TEST_URL', 'redis://127.0.0.1:6379')}/2")


@rd.delayed(bind=True)
def record(self: Any, key: str, value: str) -> str:
    marks.rpush(key, value)
    return value
