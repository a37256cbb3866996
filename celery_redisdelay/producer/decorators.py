"""The decorators' making of a task: ``@rd.delayed`` and ``@rd.batched`` options sorted into the task's own and
Celery's, checked at the decorator, and a close misspelling of one of ours warned of."""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from . import batch
from .batch import check_batch_options
from .rules import CallRules, check_limit_options, check_lock_options
from .task import ROUTING_OPTIONS, DelayedTask, combined_base

F = TypeVar("F", bound=Callable[..., Any])

# Decorator options that are ours; everything else goes to ``app.task``.
_OPTION_ATTRIBUTES = {"countdown": "default_countdown", "timeout": "visibility_timeout"}
#: The arguments of ``rd.batched`` that are attributes of a batched task.
_BATCH_ARGUMENTS = {"size": "batch_size", "max_wait": "batch_max_wait"}
#: Options of ``app.task`` besides the attributes of the task class: its own, and those Celery's autoretry reads.
_CELERY_OPTIONS = frozenset(
    {"base", "shared", "lazy", "filter", "pydantic", "pydantic_strict", "pydantic_context", "pydantic_dump_kwargs",
     "autoretry_for", "dont_autoretry_for", "retry_kwargs", "retry_backoff", "retry_backoff_max", "retry_jitter"}
)  # fmt: skip
#: How alike (difflib's ratio) an option neither Celery nor we know must be to one of ours to be taken for a
#: misspelling of it: ``limit_rat`` and ``limit_rate`` are 0.95 alike; ``count`` and ``countdown`` 0.71.
_MISSPELT = 0.8


def own_options(base: type[CallRules]) -> set[str]:
    """The decorators' own options for tasks of ``base``: the attributes of the rules their calls are parked by
    (:class:`~celery_redisdelay.producer.rules.CallRules` and its subclasses: ``lock``, ``limit_rate``,
    ``batch_size``...), the names the decorators give some of them (``countdown``, ``size``), the routing ones."""
    attributes = {
        name
        for kind in base.__mro__
        if issubclass(kind, CallRules)
        for name, value in vars(kind).items()
        if not name.startswith("_") and not callable(value) and not hasattr(value, "__get__")
    }
    renamed = {**_OPTION_ATTRIBUTES, **_BATCH_ARGUMENTS}
    aliases = {alias for alias, attribute in renamed.items() if attribute in attributes}
    return attributes | aliases | set(ROUTING_OPTIONS)


def warn_of_misspelt_options(task: str, options: Iterable[str], base: type[CallRules]) -> None:
    """Warn of a task option close to one of ours that neither celery-redisdelay nor Celery knows (``limit_rat``):
    Celery keeps it as an attribute of the task, where it does nothing. Called by the decorator, which the
    warning points at; Celery's options and attributes (``rate_limit``...) and the task's own ones pass."""
    own = sorted(own_options(base))
    known = set(own) | set(dir(base)) | _CELERY_OPTIONS
    for option in options:
        close = [] if option in known else difflib.get_close_matches(option, own, n=1, cutoff=_MISSPELT)
        if close:
            warnings.warn(
                f"option {option} of task {task} is not one of celery-redisdelay's: did you mean {close[0]}? Celery "
                "keeps it as an attribute of the task, where it does nothing; rename it",
                UserWarning,
                stacklevel=3,
            )


def decorator(app: Any, base: type[DelayedTask], options: dict[str, Any], names: set[str]) -> Callable[[F], Any]:
    """The decorator that makes a task of ``app`` over ``base`` with ``options`` (those of ``@rd.delayed``), and adds
    each task's name to ``names`` as it is made."""
    routing = {key: options.pop(key) for key in ROUTING_OPTIONS if key in options}
    task_options = {_OPTION_ATTRIBUTES.get(key, key): value for key, value in options.items()}
    task_options["base"] = combined_base(base, task_options.get("base"))
    # A delayed task parks through this extension: it must not be copied into other apps.
    task_options.setdefault("shared", False)
    if routing:
        task_options["routing_options"] = routing

    def decorate(function: F) -> Any:
        # Checked here: app.task may return a lazy proxy that builds the task class later.
        check_lock_options(function, task_options)
        check_limit_options(function, task_options)
        if issubclass(task_options["base"], batch.BatchedTask):
            check_batch_options(function, task_options)
        # The name Celery will give it (``_task_from_fun``), known now so that send_task can tell a
        # call to it without binding every pending task of the app.
        name = task_options.get("name") or app.gen_task_name(function.__name__, function.__module__)
        warn_of_misspelt_options(name, task_options, task_options["base"])
        names.add(name)
        return app.task(**task_options)(function)

    return decorate
