"""The store scripts' direct EVALSHA (``celery_redisdelay.store.evalsha``): the bytes it sends are redis-py's, and
every case it hands to redis-py (NOSCRIPT, a lost connection, a client it cannot use) still works, on a
real redis-server, at the lowest and the newest redis-py the project declares."""

from __future__ import annotations

import gc
import multiprocessing
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_redisdelay.store.calls import STORED, CallStore
from celery_redisdelay.store.evalsha import Connections, DirectScript, _Lease, direct_pool, give_back_ended
from celery_redisdelay.store.keys import Keyspace
from celery_redisdelay.testing import RedisServer

META = {"t": "tests.echo", "m": 3, "r": 60_000, "q": 60_000}


def fresh_keys() -> Keyspace:
    return Keyspace(f"evalsha-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def strict_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client that never retries on its own: whatever succeeds after a failure is our fallback's doing."""
    client = redis.Redis.from_url(f"{redis_server.url}/0", retry=Retry(NoBackoff(), 0))
    yield client
    client.close()


def packed_by_redis_py(client: redis.Redis, script: Any, keys: list[Any], args: list[Any]) -> bytes:
    connection = client.connection_pool.make_connection()
    return b"".join(connection.pack_command("EVALSHA", script.sha, len(keys), *keys, *args))


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])
def test_the_command_sent_is_the_one_redis_py_packs(redis_server: RedisServer, encoding: str) -> None:
    client = redis.Redis.from_url(f"{redis_server.url}/0", encoding=encoding)
    script = client.register_script("return 1")
    store_keys = [key.encode() for key in fresh_keys().store_keys]
    direct = DirectScript(script, Connections(client.connection_pool), store_keys)
    samples: list[tuple[list[Any], list[Any]]] = [
        ([], []),
        ([], ["id-1", b'{"body": 1}', '{"t":"x"}', "in", 60_000, "", ""]),
        (["{x}:lock:order-é"], ["déjà vu", "", -5, 0, 2**70, 1.5, -0.25]),
        ([b"bytes-key"], [b"\r\n\x00 binary", "x" * 7_000, b"y" * 70_000]),  # over redis-py's 6,000-byte chunking
    ]
    for keys, args in samples:
        expected = packed_by_redis_py(client, script, [*store_keys, *keys], args)
        assert direct.pack(keys, args) == expected, (keys, args)
    client.close()


def test_a_park_runs_directly_and_reads_back_as_parked(strict_client: redis.Redis) -> None:
    store = CallStore(strict_client, fresh_keys())
    assert store._scripts._direct, "a plain client runs the store scripts directly"
    status, due, holder = store.park_keyed("call-1", b"envelope", META, countdown_ms=60_000)
    assert (status, holder) == (STORED, "call-1")
    assert strict_client.zscore(store.keys.delayed, "call-1") == due
    assert strict_client.hget(store.keys.payloads, "call-1") == b"envelope"


def test_a_flushed_script_is_loaded_again(strict_client: redis.Redis) -> None:
    store = CallStore(strict_client, fresh_keys())
    store.park("before", b"envelope", META, countdown_ms=60_000)
    strict_client.script_flush()
    store.park("after", b"envelope", META, countdown_ms=60_000)
    assert strict_client.zscore(store.keys.delayed, "after") is not None
    assert strict_client.script_exists(store._scripts["park"].sha) == [True]


def kill_other_clients(client: redis.Redis) -> int:
    """Close every normal connection but the one asking, as a server timeout or a proxy would."""
    return int(client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"))


def test_a_connection_the_server_closed_is_replaced_even_without_retries(
    redis_server: RedisServer, strict_client: redis.Redis
) -> None:
    store = CallStore(strict_client, fresh_keys())
    store.park("first", b"envelope", META, countdown_ms=60_000)  # the thread's connection is now open
    killer = redis_server.client()
    try:
        assert kill_other_clients(killer) >= 1
        # redis-py itself would find the closed connection when taking it from the pool; here the call's
        # first attempt fails on it and redis-py's path makes it again, on a new connection.
        store.park("second", b"envelope", META, countdown_ms=60_000)
        store.park("third", b"envelope", META, countdown_ms=60_000)
    finally:
        killer.close()
    assert [strict_client.zscore(store.keys.delayed, name) is not None for name in ("second", "third")] == [True] * 2


def test_each_thread_has_a_connection_and_gives_it_back_when_it_ends(
    redis_server: RedisServer, strict_client: redis.Redis
) -> None:
    store = CallStore(strict_client, fresh_keys())
    observer = redis_server.client()
    name = f"evalsha-{uuid.uuid4().hex[:6]}"
    strict_client.connection_pool.connection_kwargs["client_name"] = name  # to count them on the server

    def ours() -> int:
        return sum(1 for entry in observer.client_list() if entry.get("name") == name)

    def parks(round_: int, thread: int) -> None:
        for number in range(50):
            store.park(f"r{round_}-t{thread}-{number}", b"envelope", META, countdown_ms=60_000)

    try:
        for round_ in range(3):  # three rounds of new threads: connections given back are used again
            threads = [threading.Thread(target=parks, args=(round_, number)) for number in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            gc.collect()
            give_back_ended()  # what the next thread's first call does, before the threads of the next round start
        assert strict_client.zcard(store.keys.delayed) == 3 * 4 * 50
        assert 1 <= ours() <= 4, "more connections than threads at once: ended threads kept theirs"
    finally:
        observer.close()


def test_an_ended_threads_connection_goes_back_outside_the_pools_lock(strict_client: redis.Redis) -> None:
    """The garbage collector may finalize an ended thread's lease in a thread that holds the pool's lock, inside
    ``get_connection``; redis-py 5's lock is not reentrant, and giving the connection back there hung every thread
    (CI, at the lowest versions). The finalizer only notes it, and the next call gives it back."""
    pool = strict_client.connection_pool
    connection = pool.get_connection(*Connections(pool)._args)
    lease = _Lease(pool, connection)

    def finalize_under_the_pools_lock() -> None:
        with pool._lock:  # where the garbage collector may run a finalizer
            lease.__del__()

    finalizing = threading.Thread(target=finalize_under_the_pools_lock, daemon=True)
    finalizing.start()
    finalizing.join(5)
    assert not finalizing.is_alive(), "a lease's finalizer waited for the pool's lock"
    lease.pid = -1  # its own finalizer, later, does nothing
    assert connection in pool._in_use_connections, "not given back by the finalizer"
    assert Connections(pool).get() is connection, "given back by the next call, which then takes it from the pool"


def park_in_child(store: CallStore, queue: Any) -> None:
    try:
        for number in range(100):
            status, _, holder = store.park_keyed(f"child-{number}", b"envelope", META, countdown_ms=60_000)
            assert (status, holder) == (STORED, f"child-{number}")
        queue.put("ok")
    except BaseException as exc:  # noqa: BLE001  # reported to the parent
        queue.put(repr(exc))


def test_a_forked_child_does_not_share_its_parents_connection(strict_client: redis.Redis) -> None:
    keys = fresh_keys()
    store = CallStore(strict_client, keys)
    store.park("parent-0", b"envelope", META, countdown_ms=60_000)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=park_in_child, args=(store, queue))  # the very store, as a fork inherits it
    child.start()
    # The parent parks on its connection while the child parks on its own: crossed replies would show
    # as another call's id.
    for number in range(1, 100):
        status, _, holder = store.park_keyed(f"parent-{number}", b"envelope", META, countdown_ms=60_000)
        assert (status, holder) == (STORED, f"parent-{number}")
    assert queue.get(timeout=30) == "ok"
    child.join(30)
    assert child.exitcode == 0
    assert strict_client.zcard(keys.delayed) == 200


def test_clients_it_cannot_use_take_redis_pys_path(redis_server: RedisServer) -> None:
    pinned = redis.Redis.from_url(f"{redis_server.url}/0", single_connection_client=True)
    try:
        assert direct_pool(pinned) is None
        store = CallStore(pinned, fresh_keys())
        assert not store._scripts._direct
        status, _, holder = store.park_keyed("pinned", b"envelope", META, countdown_ms=60_000)
        assert (status, holder) == (STORED, "pinned")
    finally:
        pinned.close()


def test_a_client_with_client_side_caching_takes_redis_pys_path() -> None:
    cache = pytest.importorskip("redis.cache", reason="client-side caching is redis-py 5.1+")
    caching = redis.Redis(host="127.0.0.1", port=1, protocol=3, cache_config=cache.CacheConfig())
    try:
        assert direct_pool(caching) is None
        assert not CallStore(caching, fresh_keys())._scripts._direct
    finally:
        caching.close()
