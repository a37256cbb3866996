"""The router's binding of ``send_task``'s arguments (producer/binding.py) against ``inspect``'s: the same arguments,
or the same ``TypeError``, for every shape of call, on the installed Celery's ``send_task`` (CI runs this file at the
lowest and the newest Celery the package declares)."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest
from celery import Celery

from celery_redisdelay.producer.binding import Binder


def send_task_signature() -> inspect.Signature:
    app = Celery("binding", broker="redis://127.0.0.1:1/0", set_as_current=False)
    try:
        return inspect.signature(app.send_task)
    finally:
        app.close()


SIGNATURE = send_task_signature()
BINDER = Binder(SIGNATURE)
POSITIONAL = [
    name for name, parameter in SIGNATURE.parameters.items() if parameter.kind is parameter.POSITIONAL_OR_KEYWORD
]

# What Celery's Task.apply_async passes to send_task, and other callers' shapes.
APPLY_ASYNC = {
    "task_id": "id-1",
    "producer": None,
    "link": None,
    "link_error": None,
    "result_cls": object,
    "shadow": None,
    "task_type": object(),
}
CALLS: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (("proj.add", (1, 2), {}), APPLY_ASYNC),
    (("proj.add", (1, 2), {"x": 1}), {**APPLY_ASYNC, "queue": "q", "countdown": 10, "priority": 3}),
    (("proj.add",), {}),
    ((), {"name": "proj.add"}),
    (("proj.add",), {"args": (1,), "kwargs": {}, "eta": "2026-01-01", "retry": False, "retry_policy": {}}),
    (("proj.add",), {"options": {"a": 1}, "headers": {"h": 1}}),  # a keyword named as the ** parameter
    (("proj.add", None, None, 5), {"queue": "q"}),  # countdown given by position
    (tuple(f"value-{n}" for n in range(len(POSITIONAL))), {}),  # every positional parameter by position
    (tuple(f"value-{n}" for n in range(len(POSITIONAL) + 1)), {}),  # one too many: TypeError
    (("proj.add", (), {}), {"args": ()}),  # given twice: TypeError
    ((), {"args": ()}),  # name missing: TypeError
]


def outcome(bind: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return dict(bind(*args, **kwargs))
    except TypeError as exc:
        return TypeError, str(exc)


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_the_binding_is_inspects(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    expected = outcome(lambda *a, **k: SIGNATURE.bind(*a, **k).arguments, args, kwargs)
    assert outcome(BINDER.arguments, args, kwargs) == expected


def test_every_mix_of_position_and_keyword_binds_as_inspect_does() -> None:
    """The first parameters given by position or by keyword in every mix, with options for the ``**`` parameter."""
    values = {name: f"v-{name}" for name in POSITIONAL[:6]}
    checked = 0
    for by_position in range(len(values) + 1):
        for keywords in itertools.product([False, True], repeat=len(values) - by_position):
            names = list(values)
            args = tuple(values[name] for name in names[:by_position])
            kwargs = {name: values[name] for name, given in zip(names[by_position:], keywords, strict=True) if given}
            for extra in ({}, {"queue": "q", "priority": 1}):
                call_kwargs = {**kwargs, **extra}
                expected = outcome(lambda *a, **k: SIGNATURE.bind(*a, **k).arguments, args, call_kwargs)
                assert outcome(BINDER.arguments, args, call_kwargs) == expected, (args, call_kwargs)
                checked += 1
    assert checked > 100


def f_positional_only(a: Any, /, b: Any = 1, *rest: Any, c: Any, **more: Any) -> None: ...


def f_no_var_keyword(a: Any, b: Any = 2, *, c: Any = 3) -> None: ...


@pytest.mark.parametrize(
    ("function", "args", "kwargs"),
    [
        (f_positional_only, (1, 2, 3), {"c": 4, "d": 5}),
        (f_positional_only, (1,), {"b": 2}),  # c missing: TypeError
        (f_no_var_keyword, (1,), {"c": 4}),
        (f_no_var_keyword, (1,), {"d": 4}),  # unknown keyword: TypeError
        (f_no_var_keyword, (), {"a": 1, "b": 2}),
    ],
)
def test_other_signatures_bind_as_inspect_does(function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    signature = inspect.signature(function)
    expected = outcome(lambda *a, **k: signature.bind(*a, **k).arguments, args, kwargs)
    assert outcome(Binder(signature).arguments, args, kwargs) == expected
