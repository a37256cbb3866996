"""A Celery app configured from ``REDISDELAY_TOPOLOGY_CONF`` (JSON of ``app.conf``), for the end-to-end tests
of a store on Redis Cluster, behind Sentinel or over TLS: the worker and beat load it, and the test process
builds the same app with :func:`make_app` to send the validation's calls."""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

from celery_redisdelay import RedisDelay

ENV = "REDISDELAY_TOPOLOGY_CONF"


def make_app(conf: dict[str, Any], name: str = "topology_proj") -> tuple[Celery, RedisDelay]:
    app = Celery(name, set_as_current=False)
    app.conf.update(
        {
            "redisdelay_tick_interval": 0.2,
            "redisdelay_claim_timeout": 5,
            "worker_prefetch_multiplier": 1,
            "worker_hijack_root_logger": False,
            "broker_connection_retry_on_startup": True,
            **conf,
        }
    )
    return app, RedisDelay(app)


app, rd = make_app(json.loads(os.environ.get(ENV) or '{"broker_url": "redis://127.0.0.1:6379/0"}'))
