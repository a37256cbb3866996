"""A Celery app configured from ``REDISDELAY_TOPOLOGY_CONF`` (JSON of ``app.conf``), for the end-to-end tests
of a store on Redis Cluster, behind Sentinel or over TLS: the worker and beat load it, and the test process
builds the same app with :func:`make_app` to send the validation's calls."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from celery import Celery

from celery_redisdelay import RedisDelay
from celery_redisdelay.operations.validation import ValidationReport, run_validation
from celery_redisdelay.testing import beat, wait_for, worker

ENV = "REDISDELAY_TOPOLOGY_CONF"
ROOT = Path(__file__).resolve().parent.parent


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


def validate_with_worker_and_beat(
    conf: dict[str, Any], rd: RedisDelay, count: int, *, timeout: float, deadline: float = 120
) -> ValidationReport:
    """Start a worker and beat on this module with ``conf``, run a validation of ``count`` messages from
    ``rd`` (the same app in the test process), stop both; the report must be complete (else it fails
    with the processes' logs)."""
    env = {ENV: json.dumps(conf), "PYTHONPATH": str(ROOT)}
    processes = [
        worker("tests.topology_proj", concurrency=2, env=env, cwd=str(ROOT)).start(),
        beat("tests.topology_proj", env=env, cwd=str(ROOT)).start(),
    ]
    try:
        wait_for(lambda: "ready." in processes[0].output(), 60, "the worker to be ready")
        report = run_validation(rd, count, fail_every=2, timeout=timeout, deadline=deadline)
        logs = "\n".join(p.output()[-3000:] for p in processes)
        assert report.ok and not report.timed_out, f"{report}\n{logs}"
        assert report.processed == count and report.failures >= count // 2
        return report
    finally:
        for process in processes:
            process.stop()
            process.remove_files()


app, rd = make_app(json.loads(os.environ.get(ENV) or '{"broker_url": "redis://127.0.0.1:6379/0"}'))
