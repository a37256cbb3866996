"""In flight: calls delivered to a worker (``{tag}:inflight``, id -> deadline), from their run's start to its
acknowledgement, under their workers' leases (``{tag}:workers``), and swept back when their deadline passes."""

from __future__ import annotations

from collections.abc import Sequence

from .base import StoreBase, step_ids, texts, which

#: How a tracked call can end (``ack``), each counted in the ``counters`` hash: run by a worker, or
#: discarded unrun by a worker because it was revoked or had expired.
OUTCOMES = ("acked", "revoked", "expired")
#: A start's op in :meth:`CallStore.track`, and its letter in track.lua.
STARTS = {"start": "s", "start-once": "S"}


class InFlight(StoreBase):
    """The store's methods for the calls in flight: runs, leases, the sweep."""

    def start(self, call_id: str, run_timeout_ms: int, lease_ms: int = 0, worker: str = "") -> int:
        """Mark a call started by ``worker``, under a lease of ``lease_ms`` (0: its run timeout alone):
        1 tracked, 2 taken back from the delay set (the sweep had put it back), 0 unknown."""
        return int(self._run("start", [call_id, run_timeout_ms, lease_ms, worker], f"mark call {call_id} started"))

    def touch(self, call_id: str, timeout_ms: int) -> bool:
        return bool(self._run("touch", [call_id, timeout_ms], f"extend the deadline of call {call_id}"))

    def ack(self, call_id: str, outcome: str = "acked") -> bool:
        """Forget a finished call, counting how it ended (one of :data:`OUTCOMES`); False when not tracked."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
        return bool(self._run("ack", [call_id, outcome], f"acknowledge call {call_id}"))

    def current(
        self, call_id: str, delivery: int, worker: str = "", retries: int | None = None, *, by_broker: bool = False
    ) -> bool:
        """Whether delivery number ``delivery`` of a call, received again by ``worker``, is its current one (see
        ``delivery.lua``): False when a later delivery was made, another worker holds the call under a live
        lease, the message's ``retries`` header is not the stored message's (an earlier attempt's copy), or the
        call no longer waits for this one. ``by_broker``: an AMQP broker redelivered it itself (the holder's channel
        closed): another worker's lease does not make it stale, and the call leaves that worker."""
        if delivery < 1:
            raise ValueError(f"a delivery number is 1 or more, not {delivery!r}")
        attempt = "" if retries is None else retries
        flag = "1" if by_broker else ""
        return bool(
            self._run("delivery", [call_id, delivery, worker, attempt, flag], f"check the delivery of call {call_id}")
        )

    def track(
        self, entries: Sequence[tuple[str, str]], run_timeout_ms: int, lease_ms: int = 0, worker: str = ""
    ) -> list[str]:
        """Write a worker process's starts and acknowledgements in one script, in order: ``entries`` are
        (op, id), op one of :data:`STARTS` or the outcome of an acknowledgement (one of :data:`OUTCOMES`); a start
        is :meth:`start` with ``run_timeout_ms``, ``lease_ms`` and ``worker``, and ``"start-once"`` one whose run,
        if cut short with its worker, is dead-lettered instead of run again (``worker/contract.py``). 1 to 1,000
        entries. The ids of the entries that found no call here."""
        ids = step_ids([call_id for _, call_id in entries])
        ops: list[str] = []
        for op, call_id in entries:
            if op not in STARTS and op not in OUTCOMES:
                raise ValueError(f"an entry is one of {', '.join((*STARTS, *OUTCOMES))}, not {op!r}")
            ops += [STARTS.get(op, op), call_id]
        action = f"write the starts and acknowledgements of {which(ids)}"
        return texts(self._run("track", [run_timeout_ms, lease_ms, worker, *ops], action))

    def sweep(
        self,
        limit: int,
        max_deliveries: int,
        unacked: Sequence[str] = (),
        lease_ms: int | None = None,
        lists: Sequence[str] = (),
        queue_timeout_ms: int | None = None,
    ) -> tuple[int, int]:
        """Deliver again the calls past their in-flight deadline (dead-letter those out of deliveries). With
        ``unacked`` (kombu's unacked hash and index, where the broker is this Redis), the deliveries their
        workers held leave kombu's hash, and a call a worker popped more than ``lease_ms`` ago but never held
        (it died first) is delivered again too; with ``lists`` too (the queue lists the release pushes onto)
        and ``queue_timeout_ms`` (the default), so is a call pushed a lease ago that is in neither its list
        nor kombu's hash (its worker died before kombu noted it). (calls put back, calls dead-lettered)."""
        args: list[int] = [limit, max_deliveries]
        keys = list(unacked)
        if lease_ms is not None:
            args.append(lease_ms)
            if unacked and lists and queue_timeout_ms is not None:
                args.append(queue_timeout_ms)
                keys += lists
        requeued, buried = self._run("sweep", args, "sweep timed-out calls", keys)
        return int(requeued), int(buried)

    def lease(self, worker: str, lease_ms: int, held: Sequence[tuple[str, str]], total: int) -> list[str]:
        """Hold ``held`` calls (id, kombu delivery tag; 1 to 1,000) for ``worker`` for ``lease_ms`` from now,
        taking those no other worker holds; ``total``: the calls the worker holds here in all. The ids it
        could not hold (unknown, finished, held by another worker)."""
        return self._leases("hold", worker, lease_ms, held, total)

    def give_back(self, worker: str, lease_ms: int, held: Sequence[tuple[str, str]]) -> list[str]:
        """``worker`` gives back the calls it holds that have not started (their messages go back to the
        broker's queue): each is queued again with its queue timeout. The ids it did not hold."""
        return self._leases("give", worker, lease_ms, held, 0)

    def put_back(self, worker: str, held: Sequence[tuple[str, str]], *, rejected: bool = False) -> list[str]:
        """``worker`` puts back calls whose messages kombu does not keep (``redisdelay_skip_unacked``): each goes
        back to the delay set due now, and the next release delivers it again. ``rejected``: their runs were
        rejected with requeue, so a start of these deliveries written later is a stale one (see lease.lua). The
        ids it could not put back (another worker holds them, or they were delivered again since)."""
        return self._leases("reject" if rejected else "requeue", worker, 0, held, -1)

    def _leases(self, op: str, worker: str, lease_ms: int, held: Sequence[tuple[str, str]], total: int) -> list[str]:
        ids = step_ids([call_id for call_id, _ in held])
        pairs = [value for call in held for value in call]
        doing = {"hold": "renew the leases of", "give": "give back", "requeue": "put back", "reject": "put back"}[op]
        action = f"{doing} {which(ids)}"
        return texts(self._run("lease", [worker, lease_ms, op, total, *pairs], action, [self.keys.workers]))
