"""Which of Celery's integration test files each run takes (``--quick``, the default, ``--full``).

``--full`` takes every file of ``t/integration`` that runs on a Redis broker and a Redis result backend: the
ones whose tests use the suite's apps (Celery's fixtures ``celery_app``/``celery_session_app``/``manager`` and
its session worker, all on ``TEST_BROKER``/``TEST_BACKEND``, which the suite points at its redis-server) or
``TEST_BROKER``/``TEST_BACKEND`` themselves. A file that needs another broker or backend (RabbitMQ, a database,
a cache, a cloud store), or makes its own app on ``memory://``, runs the same with or without the extension, or
not at all here, and is left out with the reason (:data:`NOT_REDIS`); so is a test of a kept file that does so
(:data:`NOT_REDIS_TESTS`). Each file of a Celery's ``t/integration`` must be in one list or the other: a new
Celery's new file stops ``--full`` until it is decided (:func:`full_files`).
"""

from __future__ import annotations

from pathlib import Path

INTEGRATION = "t/integration"

DEFAULT_FILES = (f"{INTEGRATION}/test_tasks.py", f"{INTEGRATION}/test_canvas.py")
QUICK_FILES = (f"{INTEGRATION}/test_tasks.py",)

#: ``--full``: the files of Celery 5.7.0's ``t/integration`` that run on a Redis broker and a Redis backend, in the
#: order ``pytest t/integration`` takes them (Celery's CI), which some need: test_backend_leak_in_fixture_teardown.py
#: stops its workers by Celery's process-wide ``should_terminate``, which ends the session worker too if it runs.
FULL_FILES = (
    # Its worker fixture cycles make TestApp apps (the suite's mode applies) on the Redis result backend; their
    # broker is TestApp's memory://, as in Celery's own Redis run. It checks their backend connections are freed.
    f"{INTEGRATION}/test_backend_leak_in_fixture_teardown.py",
    f"{INTEGRATION}/test_beat.py",  # beat's scheduler sends the tests' tasks to the session worker
    f"{INTEGRATION}/test_canvas.py",
    f"{INTEGRATION}/test_connection_recovery.py",  # a half-open connection to the Redis broker (TEST_BROKER)
    f"{INTEGRATION}/test_group_chains.py",  # groups and chords on the Redis result backend
    f"{INTEGRATION}/test_inspect.py",  # remote control of the session worker over the Redis broker
    f"{INTEGRATION}/test_loader.py",  # autodiscovery into the session app
    f"{INTEGRATION}/test_redis_backend.py",  # the Redis result backend: pub/sub, chords, expiry
    f"{INTEGRATION}/test_security.py",  # the auth serializer on the session worker
    f"{INTEGRATION}/test_serialization.py",  # `celery worker` processes on the app's broker and backend
    f"{INTEGRATION}/test_tasks.py",
    f"{INTEGRATION}/test_worker.py",  # the session worker's pidbox; a worker on TEST_BROKER (less NOT_REDIS_TESTS)
)

#: The files ``--full`` leaves out, each with why it does not run on a Redis broker and backend.
NOT_REDIS: dict[str, str] = {
    f"{INTEGRATION}/test_backend.py": "the Azure Block Blob backend (AZUREBLOCKBLOB_URL, the azure package)",
    f"{INTEGRATION}/test_cache_backend.py": "the memcached cache backend (cache+memcached://); skips on any other",
    f"{INTEGRATION}/test_database_backend.py": "the SQLAlchemy database backend (db+sqlite://, sqlalchemy)",
    f"{INTEGRATION}/test_events_state_memory_leak.py": "its own Celery() app on memory:// and cache+memory://",
    f"{INTEGRATION}/test_logfile_format.py": "a Celery() app's logging in a subprocess: no broker, no backend",
    f"{INTEGRATION}/test_mem_leak_in_exception_handling.py": "its own eager Celery() app on memory://",
    f"{INTEGRATION}/test_request_backend_down.py": "its own Celery() app on memory://, a backend on a closed port",
    f"{INTEGRATION}/test_upgrade.py": "the `celery upgrade settings` command on a settings file: no broker",
}

#: Tests of :data:`FULL_FILES` that ``--full`` deselects (pytest's ``--deselect``), each with why.
NOT_REDIS_TESTS: dict[str, str] = {
    f"{INTEGRATION}/test_worker.py::test_run_worker": "a `celery worker` on an unreachable RabbitMQ (amqp://)",
    f"{INTEGRATION}/test_worker.py::test_django_fixup_direct_worker": "Django: a Celery() app on memory://",
    f"{INTEGRATION}/test_worker.py::test_django_fixup_installs_django_task_for_celery_subclass": (
        "Django: a Celery() subclass's app on memory://"
    ),
    f"{INTEGRATION}/test_worker.py::test_django_fixup_signals_only_handled_by_own_app": (
        "Django: two Celery() apps on memory://"
    ),
}


def full_files(folder: Path) -> tuple[str, ...]:
    """:data:`FULL_FILES` of the sdist in ``folder``; ValueError when its ``t/integration`` has a test file
    neither :data:`FULL_FILES` nor :data:`NOT_REDIS` names (or lacks one FULL_FILES names)."""
    found = {f"{INTEGRATION}/{path.name}" for path in (folder / INTEGRATION).glob("test_*.py")}
    unknown = sorted(found - set(FULL_FILES) - set(NOT_REDIS))
    missing = sorted(set(FULL_FILES) - found)
    if unknown or missing:
        raise ValueError(
            f"--full: {folder / INTEGRATION} has test files not decided in celery_suite/selection.py: {unknown}"
            f"; files it names that are missing there: {missing}"
        )
    return FULL_FILES
