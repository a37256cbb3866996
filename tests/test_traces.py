"""Traces across the wait: with ``opentelemetry-instrumentation-celery``, a call's trace goes through the store.

The producer (this process, instrumented for the test) opens a span and sends; a real worker (its pool processes
instrumented as the instrumentation's documentation says, spans written to files) runs the call. The store keeps
Celery's headers, ``traceparent`` among them, so the release sends on the producer's trace and the runs are its
children: a countdown parked, released, retried with a countdown (parked again) and run twice is one trace; so is a
tracked call due now, and a call that waited on a pause.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from celery_redisdelay.testing import RedisServer, wait_for, worker
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

FLAKY = "tests.traces_proj.flaky"
PLAIN = "tests.traces_proj.plain"


class Traced:
    """The running worker, the folder its processes write their spans to, and this process's own tracer."""

    def __init__(self, spans: Path, proj: Any) -> None:
        self.spans = spans
        self.proj = proj
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer(__name__)

    def worker_spans(self) -> list[dict[str, Any]]:
        rows = []
        for path in self.spans.glob("*.jsonl"):
            rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return rows

    def runs(self, trace_id: str, task: str, count: int) -> list[dict[str, Any]]:
        """The worker's run spans of ``task`` on the trace, once there are ``count`` (within a deadline)."""

        def found() -> list[dict[str, Any]] | None:
            spans = [s for s in self.worker_spans() if s["name"] == f"run/{task}" and s["trace_id"] == trace_id]
            return spans if len(spans) >= count else None

        return wait_for(found, 60, f"{count} run(s) of {task} on trace {trace_id}: {self.summary()}")  # type: ignore[no-any-return]

    def summary(self) -> list[tuple[str, str]]:
        return [(s["name"], s["trace_id"]) for s in self.worker_spans()]


@pytest.fixture(scope="module")
def traced(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    spans = tmp_path_factory.mktemp("spans")
    env = {"REDISDELAY_TEST_URL": redis_server.url, "REDISDELAY_TEST_SPANS": str(spans), "PYTHONPATH": str(ROOT)}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        from tests import traces_proj

        traces_proj.rd.depot.client.flushdb()
        running = worker("tests.traces_proj", concurrency=2, queues="traces", env=env, cwd=str(ROOT)).start()
        try:
            wait_for(lambda: "ready." in running.output(), 60, "the traced worker to be ready")
            state = Traced(spans, traces_proj)
            # The producer side: this process, instrumented only while the module's tests run.
            instrumentor = CeleryInstrumentor()
            instrumentor.instrument(tracer_provider=state.provider)
            try:
                yield state
            finally:
                instrumentor.uninstrument()
        finally:
            running.stop()
            print(running.output()[-3000:])
            running.remove_files()


def test_a_parked_call_its_retry_and_its_runs_are_one_trace(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("send a countdown") as root:
        result = traced.proj.flaky.apply_async((1,), countdown=0.5)
        trace_id = format(root.get_span_context().trace_id, "032x")
    assert traced.proj.rd.find(result.id) is not None, "the countdown was not parked"
    runs = traced.runs(trace_id, FLAKY, 2)
    assert result.get(timeout=30) == 1
    retry = [s for s in traced.worker_spans() if s["name"] == f"apply_async/{FLAKY}" and s["trace_id"] == trace_id]
    assert retry, f"the retry was not sent on the producer's trace: {traced.summary()}"
    # Each run is a child of a send on the trace: the first of the producer's, the second of the retry's.
    sends = {s["span_id"] for s in retry} | {
        format(s.context.span_id, "016x") for s in traced.exporter.get_finished_spans() if s.name.startswith("apply")
    }
    assert {run["parent_id"] for run in runs} <= sends, (runs, sends)


def test_a_tracked_call_due_now_is_on_the_producers_trace(traced: Traced) -> None:
    with traced.tracer.start_as_current_span("send a call due now") as root:
        result = traced.proj.plain.delay(7)
        trace_id = format(root.get_span_context().trace_id, "032x")
    traced.runs(trace_id, PLAIN, 1)
    assert result.get(timeout=30) == 7


def test_a_call_that_waited_on_a_pause_is_on_the_producers_trace(traced: Traced) -> None:
    rd = traced.proj.rd
    rd.pause(task=PLAIN, reason="trace test")
    try:
        with traced.tracer.start_as_current_span("send a paused call") as root:
            result = traced.proj.plain.apply_async((8,), countdown=0.2)
            trace_id = format(root.get_span_context().trace_id, "032x")
        wait_for(
            lambda: any(p["name"] == PLAIN and p["waiting"] for p in rd.paused()), 30, "the call to wait on the pause"
        )
        assert not [s for s in traced.worker_spans() if s["trace_id"] == trace_id and s["name"] == f"run/{PLAIN}"]
    finally:
        rd.resume(task=PLAIN)
    traced.runs(trace_id, PLAIN, 1)
    assert result.get(timeout=30) == 8
