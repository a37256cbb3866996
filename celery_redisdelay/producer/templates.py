"""Call templates: the stored form of a task's calls that differ only in their id and arguments.

Celery builds the message of a call (routing, headers, options) in ``send_task``. Another call of the
same task with the same options differs from it in its id (``id``, the ``root_id`` and
``correlation_id`` that repeat it, the delivery tag), its arguments (the body, ``argsrepr``,
``kwargsrepr``), the caller's reply queue (``reply_to``, one per thread) and the eta Celery computes at
the call (kept in the private header ``ETA_HEADER``), and in nothing else. A
template renders such calls without Celery: the stored text is cut once around those values, and a
call is the pieces joined with its own values, each JSON-encoded as kombu's JSON encodes a string.
No message is JSON-dumped per call.

A template proves itself when it is made: it renders the call it was made from and must give back,
byte for byte, what Celery built for that call, or it is not made. The values it computes per call
are computed as Celery computes them (kombu's ``dumps`` for the body, Celery's ``saferepr`` for the
reprs), so every call rendered from it is the message Celery would have built.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import replace
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any

from celery.utils.saferepr import saferepr
from kombu.exceptions import EncodeError, KombuError
from kombu.serialization import dumps, loads, registry
from kombu.utils import json as kombu_json

from ..errors import PayloadError
from ..message.envelope import Envelope
from ..message.marks import ETA_HEADER

if TYPE_CHECKING:
    from celery import Celery

    from ..message import wire

#: What a template fills in per call; ``id`` also stands for a ``root_id`` or ``correlation_id`` equal
#: to it (a call made outside a task is its own root); ``tag`` is a broker message's first delivery tag;
#: ``eta`` the value of :data:`~celery_redisdelay.message.marks.ETA_HEADER` (calls with an eta have it).
SLOTS = ("id", "tag", "argsrepr", "kwargsrepr", "reply_to", "eta", "body")


#: kombu's JSON encoder, made once: ``kombu.utils.json.dumps(value)`` is ``json.dumps(value, cls=JSONEncoder)``,
#: which makes one per call.
_JSON = kombu_json.JSONEncoder()


def _mark(slot: str) -> str:
    """A placeholder no real value contains."""
    return f"\x00{slot}\x00"


def repr_levels(app: Celery) -> int:
    """``maxlevels`` of Celery's argsrepr/kwargsrepr: ``task_repr_maxlevels`` (Celery 5.7), else 3, as
    saferepr's default is."""
    levels = app.conf.get("task_repr_maxlevels")
    return int(levels) if levels else 3


class CallTemplate:
    """The stored form of calls like one Celery built, for any id and arguments (see the module).

    Make one with :meth:`of`, which checks it; ``fixed_reprs`` says whether the caller gave
    ``argsrepr`` / ``kwargsrepr`` (kept as they are) rather than Celery computing them per call.
    """

    def __init__(
        self,
        app: Celery,
        envelope: Envelope,
        fast: wire.Template | None,
        serializer: str,
        embed: Any,
        fixed_reprs: tuple[bool, bool] = (False, False),
    ) -> None:
        self.app = app
        self.task = envelope.task
        self.fast = fast
        self.serializer = serializer
        self.embed = embed
        self.argsrepr_maxsize = app.amqp.argsrepr_maxsize
        self.kwargsrepr_maxsize = app.amqp.kwargsrepr_maxsize
        self.levels = repr_levels(app)
        self.repr_slots = (not fixed_reprs[0], not fixed_reprs[1])
        headers = dict(envelope.headers)
        properties = dict(fast.properties if fast is not None else envelope.properties)
        call_id = headers["id"]
        self.reply_to_slot = properties.get("reply_to") == app.thread_oid
        headers["id"] = _mark("id")
        if headers.get("root_id") == call_id:
            headers["root_id"] = _mark("id")
        if properties.get("correlation_id") == call_id:
            properties["correlation_id"] = _mark("id")
        if self.reply_to_slot:
            properties["reply_to"] = _mark("reply_to")
        for name, computed in zip(("argsrepr", "kwargsrepr"), self.repr_slots, strict=True):
            if computed:
                headers[name] = _mark(name)
        self.eta_slot = isinstance(headers.get(ETA_HEADER), str)
        if self.eta_slot:
            headers[ETA_HEADER] = _mark("eta")
        if fast is not None:
            text = fast.text(headers, properties, _mark("body"), _mark("tag"))
        else:
            marked = replace(envelope, headers=headers, properties=properties, body=_mark("body").encode())
            text = marked.encode().decode()
        self.pieces, self.order = _cut(text)

    @classmethod
    def of(
        cls,
        app: Celery,
        envelope: Envelope,
        stored: bytes,
        fast: wire.Template | None,
        *,
        given: tuple[Any, Any] | None = None,
        fixed_reprs: tuple[bool, bool] = (False, False),
        per_call_only: bool = True,
    ) -> CallTemplate | None:
        """The template of calls like ``envelope`` (stored as ``stored``), or None when a template cannot
        render them exactly: compression, a serializer kombu does not name, an envelope body that is not
        text, or a render of this very call that differs from ``stored``. ``given`` are the caller's own
        args and kwargs, rendered for that check as given (a list stays a list in ``argsrepr``); without
        them, the ones decoded from the body.

        With ``per_call_only`` (templates kept for later calls), a message with anything computed at
        the call besides the id and arguments is refused too: a parent, an expiry, a group, callbacks.
        ``task.park_many`` allows those, the same for all its calls, made at the same moment.
        """
        headers = envelope.headers
        call_id = headers.get("id")
        serializer = registry.type_to_name.get(envelope.content_type)
        if (
            serializer is None
            or not isinstance(call_id, str)
            or headers.get("compression")
            or headers.get("eta") is not None
        ):
            return None
        if fast is None and envelope.content_encoding != "utf-8":
            return None
        try:  # the body Celery has just built from the caller's own arguments, in this process
            args, kwargs, embed = loads(
                envelope.body, envelope.content_type, envelope.content_encoding, accept={envelope.content_type}
            )
        except (KombuError, ValueError, TypeError):
            return None
        if per_call_only and (
            headers.get("parent_id") is not None
            or headers.get("root_id") != call_id
            or headers.get("expires") is not None
            or headers.get("group") is not None
            or any(embed.values())
        ):
            return None
        template = cls(app, envelope, fast, serializer, embed, fixed_reprs)
        reply_to = envelope.properties.get("reply_to")
        args, kwargs = (given[0] or (), given[1] or {}) if given is not None else (tuple(args), kwargs)
        eta = headers.get(ETA_HEADER)
        try:
            again = template.render(call_id, args, kwargs, reply_to, eta=eta)
            joined = template.render(call_id, args, kwargs, reply_to, body_rest=template.body_rest(kwargs), eta=eta)
        except PayloadError:
            return None
        return template if again == joined == stored else None

    def argsrepr(self, args: Sequence[Any]) -> str:
        """Celery's ``argsrepr`` header of a call (as ``app.amqp`` computes it)."""
        return flat_saferepr(args, self.argsrepr_maxsize) or str(
            saferepr(args, self.argsrepr_maxsize, maxlevels=self.levels)
        )

    def kwargsrepr(self, kwargs: Any) -> str:
        return flat_saferepr(kwargs, self.kwargsrepr_maxsize) or str(
            saferepr(kwargs, self.kwargsrepr_maxsize, maxlevels=self.levels)
        )

    def body(self, args: Sequence[Any], kwargs: Any, rest: str | None = None) -> bytes:
        """The call's serialized body, as kombu serializes it when Celery publishes. With JSON and
        ``rest`` (:meth:`body_rest` of the kwargs, for calls that share them), only the args are encoded:
        kombu's JSON of the tuple is the JSON of each part joined as its encoder joins list items."""
        try:
            if rest is not None:
                return ("[" + str(_JSON.encode(args)) + rest).encode()
            if self.kombu_json():  # what kombu's dumps does for it: json.dumps with kombu's encoder
                return str(_JSON.encode((args, kwargs, self.embed))).encode()
            _, _, data = dumps((args, kwargs, self.embed), serializer=self.serializer)
        except (EncodeError, TypeError, ValueError) as exc:  # kombu's JSON alone raises the latter two
            raise PayloadError(
                f"cannot serialize the arguments {args!r} of {self.task} with serializer {self.serializer!r}: "
                f"{exc}; pass arguments that serializer can encode, nothing was stored"
            ) from exc
        return data if isinstance(data, bytes) else data.encode()

    def kombu_json(self) -> bool:
        """Whether the body is kombu's own JSON (not a serializer registered over it since): then it is
        encoded here directly, as kombu's ``dumps`` encodes it."""
        return self.serializer == "json" and _registered_encoder("json") is kombu_json.dumps

    def body_rest(self, kwargs: Any) -> str | None:
        """What follows the args in the JSON body of calls with these ``kwargs`` (None: not kombu's JSON)."""
        if not self.kombu_json():
            return None
        try:
            return f", {kombu_json.dumps(kwargs)}, {kombu_json.dumps(self.embed)}]"
        except (TypeError, ValueError):
            return None  # then the whole body through kombu, which says what is wrong

    def render(
        self,
        call_id: str,
        args: Sequence[Any],
        kwargs: Any,
        reply_to: str | None = None,
        kwargsrepr: str | None = None,
        body_rest: str | None = None,
        eta: str | None = None,
    ) -> bytes:
        """The stored form of the call ``call_id`` with ``args`` and ``kwargs``, and ``eta`` where the template
        has that slot; ``kwargsrepr`` and ``body_rest`` when the caller has them already (``park_many`` shares
        one kwargs among its calls)."""
        data = self.body(args, kwargs, body_rest)
        if self.fast is not None:
            body = base64.b64encode(data).decode()
        else:
            try:
                body = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise PayloadError(
                    f"the body of a call of {self.task} is not text ({exc}); nothing was stored"
                ) from exc
        values = {
            "id": encode_basestring_ascii(call_id),
            "tag": encode_basestring_ascii(f"{call_id}.1"),
            "body": encode_basestring_ascii(body),
        }
        if self.repr_slots[0]:
            values["argsrepr"] = encode_basestring_ascii(self.argsrepr(args))
        if self.repr_slots[1]:
            values["kwargsrepr"] = encode_basestring_ascii(
                self.kwargsrepr(kwargs) if kwargsrepr is None else kwargsrepr
            )
        if self.reply_to_slot:
            values["reply_to"] = encode_basestring_ascii(reply_to or str(self.app.thread_oid))
        if self.eta_slot:
            if eta is None:
                raise PayloadError(f"a call of {self.task} rendered without the eta its template has a slot for")
            values["eta"] = encode_basestring_ascii(eta)
        pieces = self.pieces
        out = [pieces[0]]
        for index, slot in enumerate(self.order, start=1):
            out.append(values[slot])
            out.append(pieces[index])
        return "".join(out).encode()


def _registered_encoder(serializer: str) -> Any:
    """The function kombu's registry encodes with for ``serializer`` (None when it has none)."""
    codec = registry._encoders.get(serializer)
    return codec[2] if codec is not None else None


def flat_saferepr(value: Any, maxlen: int) -> str | None:
    """Celery's ``saferepr(value, maxlen)`` of a flat tuple, or dict with string keys, of ``str``, ``int``,
    ``float``, ``bool`` and None that is shorter than ``maxlen``, written out directly (saferepr walks a
    token stream); None for anything else, which then goes to saferepr itself.

    saferepr writes a string between single quotes with only those escaped, a number with ``str``, None
    as ``None``, and a tuple of one with its comma; ``tests/test_templates.py`` proves this equal to
    Celery's on random values."""
    parts: list[str] = []
    kind = type(value)
    if kind is tuple:
        for item in value:
            shown = _flat_item(item)
            if shown is None:
                return None
            parts.append(shown)
        text = "(" + ", ".join(parts) + (",)" if len(parts) == 1 else ")")
    elif kind is dict:
        for key, item in value.items():
            shown = _flat_item(item)
            if type(key) is not str or shown is None:
                return None
            parts.append(f"{_flat_item(key)}: {shown}")
        text = "{" + ", ".join(parts) + "}"
    else:
        return None
    return text if len(text) < maxlen else None


def _flat_item(item: Any) -> str | None:
    kind = type(item)
    if kind is str:
        return "'" + str(item).replace("'", "\\'") + "'"
    if kind is int or kind is float or kind is bool:
        return str(item)
    if item is None:
        return "None"
    return None


def _cut(text: str) -> tuple[list[str], list[str]]:
    """Cut a rendered text at every JSON-encoded placeholder: (the pieces around them, their slots)."""
    tokens = {encode_basestring_ascii(_mark(slot)): slot for slot in SLOTS}
    pieces: list[str] = []
    order: list[str] = []
    rest = text
    while True:
        found = [(rest.find(token), token) for token in tokens if token in rest]
        if not found:
            pieces.append(rest)
            return pieces, order
        at, token = min(found)
        pieces.append(rest[:at])
        order.append(tokens[token])
        rest = rest[at + len(token) :]
