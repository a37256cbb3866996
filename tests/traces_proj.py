"""The Celery app the trace tests run in a real worker, traced by ``opentelemetry-instrumentation-celery``.

Configured from the environment the test sets: ``REDISDELAY_TEST_URL`` (a redis:// URL without database) and
``REDISDELAY_TEST_SPANS`` (a folder: each process writes the spans it ends there, one JSON object a line, to a
file of its own). The app adopts every task (``redisdelay_all_tasks``) and tracks the calls due now, so a plain
task's call is tracked and a countdown is parked.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from celery import Celery, signals
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from celery_redisdelay import RedisDelay

URL = os.environ.get("REDISDELAY_TEST_URL", "redis://127.0.0.1:6379")

app = Celery("traces_proj", broker=f"{URL}/4", backend=f"{URL}/5")
app.conf.update(
    redisdelay_url=f"{URL}/4",
    redisdelay_key_prefix="traces",
    redisdelay_all_tasks=True,
    redisdelay_track_due_now=True,
    redisdelay_tick_interval=0.2,
    task_default_queue="traces",
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)
rd = RedisDelay(app)


class FileExporter(SpanExporter):
    """Writes each span it is given to this process's file, at once (the tests read them while the worker runs)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / f"{os.getpid()}.jsonl"

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.path.open("a") as file:
            for span in spans:
                context = span.get_span_context()
                assert context is not None
                row = {
                    "name": span.name,
                    "trace_id": format(context.trace_id, "032x"),
                    "span_id": format(context.span_id, "016x"),
                    "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                    "attributes": {key: str(value) for key, value in (span.attributes or {}).items()},
                    "pid": os.getpid(),
                }
                file.write(json.dumps(row) + "\n")
        return SpanExportResult.SUCCESS


def tracer_provider() -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": "traces_proj"}))
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(Path(os.environ["REDISDELAY_TEST_SPANS"]))))
    return provider


@signals.worker_process_init.connect(weak=False)
def _trace_the_pool_process(**_: Any) -> None:
    """The instrumentation's documented place under prefork: each pool process, once it is forked."""
    CeleryInstrumentor().instrument(tracer_provider=tracer_provider())


@app.task(bind=True, max_retries=3)
def flaky(self: Any, failures: int) -> int:
    """Fails ``failures`` times, each time retried with a countdown (parked again), then returns its retries."""
    if self.request.retries < failures:
        raise self.retry(countdown=0.5)
    return int(self.request.retries)


@app.task
def plain(value: int) -> int:
    return value
