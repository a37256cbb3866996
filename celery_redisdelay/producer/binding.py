"""Binding a call's arguments to a function's parameters, as ``inspect.Signature.bind(...).arguments`` does, in a
few microseconds where ``inspect`` takes some forty: the router binds every call of ``app.send_task`` it may park.

Only the common shape is bound here: arguments that fill positional-or-keyword parameters, keyword arguments that
name a parameter or fall into the function's ``**`` parameter, every parameter without a default given. Anything
else (too many positional arguments, one given twice, a positional-only or ``*args`` parameter, a missing one) is
left to ``inspect``, which binds it or raises its own ``TypeError``. ``tests/test_binding.py`` checks the two
against each other, on Celery's ``send_task`` at the lowest and the newest Celery the package declares.
"""

from __future__ import annotations

import inspect
from typing import Any

_PLAIN = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class Binder:
    """``signature.bind(*args, **kwargs).arguments`` of one signature: an equal dict (its keys in the order given,
    where ``inspect`` orders them as the parameters; the router reads it as a mapping)."""

    def __init__(self, signature: inspect.Signature) -> None:
        self.signature = signature
        parameters = list(signature.parameters.values())
        kinds = {parameter.kind for parameter in parameters}
        #: Whether the fast path applies at all: no positional-only and no ``*args`` parameter.
        self.simple = not kinds & {inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL}
        self.positional = tuple(
            parameter.name for parameter in parameters if parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        )
        self.named = frozenset(parameter.name for parameter in parameters if parameter.kind in _PLAIN)
        self.required = frozenset(
            parameter.name
            for parameter in parameters
            if parameter.kind in _PLAIN and parameter.default is inspect.Parameter.empty
        )
        self.var_keyword = next(
            (parameter.name for parameter in parameters if parameter.kind is inspect.Parameter.VAR_KEYWORD), None
        )

    def arguments(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The arguments bound to their parameters' names; those of the ``**`` parameter, a dict under its name."""
        if not self.simple or len(args) > len(self.positional):
            return dict(self.signature.bind(*args, **kwargs).arguments)
        bound = dict(zip(self.positional, args, strict=False))
        extra: dict[str, Any] = {}
        for name, value in kwargs.items():
            if name in self.named:
                if name in bound:  # given twice: inspect's TypeError
                    return dict(self.signature.bind(*args, **kwargs).arguments)
                bound[name] = value
            elif self.var_keyword is not None:
                extra[name] = value
            else:  # an unknown keyword: inspect's TypeError
                return dict(self.signature.bind(*args, **kwargs).arguments)
        if not self.required <= bound.keys():  # one missing: inspect's TypeError
            return dict(self.signature.bind(*args, **kwargs).arguments)
        if extra and self.var_keyword is not None:
            bound[self.var_keyword] = extra
        return bound
