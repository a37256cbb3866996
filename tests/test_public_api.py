"""The public API as it stood before the package was split into layers: names, signatures, the command line's
entry point, the settings and the dashboard. A change here is a change for users, and must be deliberate."""

from __future__ import annotations

import dataclasses
import inspect
from importlib.metadata import entry_points

import celery_redisdelay
import celery_redisdelay.testing
import celery_redisdelay.web
from celery_redisdelay import RedisDelay
from celery_redisdelay.settings import Settings

PACKAGE = {
    "Abandon",
    "BatchedTask",
    "ConfigurationError",
    "DelayedTask",
    "Lock",
    "LockTimeout",
    "NotReplicatedError",
    "PayloadError",
    "RedisDelay",
    "RedisDelayError",
    "ScheduleError",
    "StoreUnavailableError",
    "ValidationReport",
    "__version__",
    "run_validation",
}
EXTENSION = {
    "BatchedTask", "Task", "accepted_content_types", "batched", "broker_layout", "cancel", "cancel_many",
    "check_config", "check_server", "check_size", "client", "dead_letters", "delayed", "fast_release", "find",
    "keys", "lock", "of", "ping", "registered", "releaser", "releaser_for", "releasers", "requeue", "reschedule",
    "send_task", "settings", "shards", "stats", "store", "templates", "tick", "wire_format",
}  # fmt: skip
TASK = {
    "apply_async", "call_limits", "default_countdown", "lock", "lock_name", "lock_retry", "lock_timeout",
    "max_deliveries", "park", "park_many", "park_sent", "queue_timeout", "routing_options", "touch",
    "visibility_timeout",
}  # fmt: skip
TESTING = {
    "CeleryProcess", "DEBIAN_REDIS_SERVER", "RedisServer", "beat", "free_port", "kill_group",
    "redis_server_binary", "stop_process", "wait_for", "worker",
}  # fmt: skip
SETTINGS = {
    "url", "key_prefix", "tick_interval", "visibility_timeout", "queue_timeout", "claim_timeout", "max_deliveries",
    "release_batch", "fast_release", "precise_release", "max_payload_bytes", "shards", "cluster",
    "connection_options", "wait_replicas", "wait_timeout",
    # added since: whole-app adoption
    "all_tasks", "park_received", "park_received_after",
    # added since: leases held by the worker
    "lease", "lease_renewal", "skip_unacked",
    # added since: every call tracked
    "track_due_now",
    "worker_lost",  # 0.6.0: each task's contract when its worker dies mid-run
    "probe_file",  # 0.6.0: the worker probe's file, for probes without store access
}  # fmt: skip
COMMANDS = {
    "cancel", "exporter", "list", "purge", "releaser", "requeue", "reschedule", "run-now", "show", "status",
    "validate", "web",
    # added since: whole-app adoption
    "adopt",
    # added since: the Grafana dashboard and alert rules
    "monitoring",
    # added since: limits across every worker
    "limits",
    # added since: pause and resume
    "pause", "resume", "paused",
    # 0.6.0: the worker probe, and the way out
    "probe", "drain",
}  # fmt: skip


def public(names: object) -> set[str]:
    return {name for name in dir(names) if not name.startswith("_")}


def test_the_package_exports_what_it_did() -> None:
    assert set(celery_redisdelay.__all__) == PACKAGE
    for name in PACKAGE:
        assert getattr(celery_redisdelay, name) is not None


def test_the_extension_and_the_task_class_keep_their_names(rd: RedisDelay) -> None:
    assert public(RedisDelay) | public(rd) >= EXTENSION
    assert public(celery_redisdelay.DelayedTask) >= TASK
    assert list(inspect.signature(celery_redisdelay.run_validation).parameters)[:2] == ["rd", "count"]
    assert [releaser.store for releaser in rd.releasers] == rd.shards.all()


def test_run_validation_and_the_collector_take_the_extension_as_before(rd: RedisDelay) -> None:
    from celery_redisdelay.operations.metrics import RedisDelayCollector

    assert RedisDelayCollector(rd=rd).depot is rd.depot
    assert list(inspect.signature(RedisDelayCollector).parameters) == ["rd", "namespace"]
    assert RedisDelayCollector(rd.depot).depot is rd.depot


def test_testing_keeps_its_names() -> None:
    assert set(celery_redisdelay.testing.__all__) == TESTING
    assert public(celery_redisdelay.testing) >= TESTING


def test_the_settings_are_the_same() -> None:
    assert {field.name for field in dataclasses.fields(Settings)} == SETTINGS


def test_the_command_line_entry_point_and_its_commands() -> None:
    [entry] = [entry for entry in entry_points(group="celery.commands") if entry.name == "redisdelay"]
    assert entry.value == "celery_redisdelay.cli:redisdelay"
    assert set(entry.load().commands) == COMMANDS


def test_the_dashboard_is_mounted_as_before() -> None:
    assert {"create_app", "serve"} <= public(celery_redisdelay.web)
    parameters = inspect.signature(celery_redisdelay.web.create_app).parameters
    assert list(parameters) == ["target", "read_only", "auth", "secret", "scan", "budget"]
