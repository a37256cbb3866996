"""Parked calls in bulk, without parking them one by one: copies of one real parked call.

One call is parked through ``apply_async``; its stored envelope and metadata are read back, and
copies are written straight into the store with a pipeline, each under a fresh uuid4 that also
replaces the original id inside the stored message (headers ``id`` and ``root_id``, ``correlation_id``).
The store then holds what parking the calls one by one would have left, only much faster.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import redis

from .app import BenchApp

CHUNK = 1000


@dataclass(frozen=True)
class Template:
    """A parked call as stored: its id, envelope and metadata."""

    call_id: str
    payload: bytes
    meta: bytes


def template(bench: BenchApp, queue: str, task: Any = None, args: tuple[Any, ...] = (0,)) -> Template:
    """Park one real call of ``task`` (``bench.delayed_noop`` by default) routed to ``queue``, read it back
    and take it out again."""
    rd = bench.rd
    result = (task or bench.delayed_noop).apply_async(args, countdown=3600, queue=queue)
    client: Any = rd.client
    payload, meta = client.hmget(rd.keys.payloads, result.id), client.hmget(rd.keys.meta, result.id)
    if payload[0] is None or meta[0] is None:
        raise RuntimeError(f"call {result.id} was parked but its payload or metadata is not in the store")
    if not rd.cancel(result.id):
        raise RuntimeError(f"could not take template call {result.id} out of the store")
    return Template(result.id, bytes(payload[0]), bytes(meta[0]))


def new_id(template: Template) -> bytes:
    """A fresh uuid4 of the template id's length and form (Celery's: 36 characters with dashes).

    The stored form of the fast release path is length-prefixed, so the id must keep its length.
    """
    fresh = str(uuid.uuid4()) if len(template.call_id) == 36 else uuid.uuid4().hex
    if len(fresh) != len(template.call_id):
        raise RuntimeError(f"cannot make copies of call id {template.call_id!r}: not a uuid4")
    return fresh.encode()


def write_copies(
    client: redis.Redis,
    template: Template,
    count: int,
    score_ms: float,
    *,
    zset: str,
    payloads: str,
    meta: str | None,
    chunk: int = CHUNK,
) -> None:
    """Write ``count`` copies of ``template`` scored ``score_ms``: one ZADD and one HSET (or two) per chunk."""
    old = template.call_id.encode()
    for start in range(0, count, chunk):
        ids = [new_id(template) for _ in range(min(chunk, count - start))]
        members: list[Any] = []
        envelopes: list[Any] = []
        metas: list[Any] = []
        for call_id in ids:
            members += (score_ms, call_id)
            envelopes += (call_id, template.payload.replace(old, call_id))
            metas += (call_id, template.meta)
        pipe: Any = client.pipeline(transaction=False)
        pipe.execute_command("ZADD", zset, *members)
        pipe.execute_command("HSET", payloads, *envelopes)
        if meta is not None:
            pipe.execute_command("HSET", meta, *metas)
        pipe.execute()


def park_copies(bench: BenchApp, client: redis.Redis, template: Template, count: int, score_ms: float) -> None:
    """``count`` copies of ``template`` in the call store, due at ``score_ms``."""
    keys = bench.rd.keys
    write_copies(client, template, count, score_ms, zset=keys.delayed, payloads=keys.payloads, meta=keys.meta)
