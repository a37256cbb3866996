"""A list page's query string: state, filter, order, page size, cursor and scan bound, checked, and turned
back into a URL, so every filter is a link an operator can bookmark or share."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from flask import abort, url_for
from werkzeug.datastructures import MultiDict

from ..operations.listing import LISTS, ORDERS, Filter

PAGE_SIZES = (25, 50, 100, 200, 500)
MOST_SCAN = 100_000


@dataclass(frozen=True)
class ListQuery:
    """What a list page shows; the defaults are left out of its URL."""

    state: str
    task: str = ""
    queue: str = ""
    q: str = ""  # searched for in args and kwargs
    order: str = "oldest"
    limit: int = 50
    cursor: str = ""
    scan: int = 10_000

    @classmethod
    def parse(cls, state: str, args: MultiDict[str, str], default_scan: int = 10_000) -> ListQuery:
        """The query of a request, or a 404 for an unknown state and a 400 for a value out of range."""
        if state not in LISTS:
            abort(404, f"There is no list of {state!r} calls; the lists are {', '.join(LISTS)}.")
        order = args.get("order", "oldest")
        if order not in ORDERS:
            abort(400, f"order must be one of {', '.join(ORDERS)}, not {order!r}.")
        limit = _number(args, "limit", 50, 1, max(PAGE_SIZES))
        scan = _number(args, "scan", default_scan, 1, MOST_SCAN)
        text = {name: args.get(name, "").strip() for name in ("task", "queue", "q", "cursor")}
        return cls(state, order=order, limit=limit, scan=scan, **text)

    @property
    def filter(self) -> Filter:
        return Filter(self.task or None, self.queue or None, self.q or None)

    @property
    def newest_first(self) -> bool:
        return self.order == "newest"

    def params(self, **changes: Any) -> dict[str, Any]:
        """The query string's fields that differ from the defaults, after ``changes``."""
        changed, default = replace(self, **changes), ListQuery(self.state)
        return {
            name: value
            for name, value in asdict(changed).items()
            if name != "state" and value != getattr(default, name)
        }

    def url(self, **changes: Any) -> str:
        """This page's URL with ``changes`` (a new filter starts at the first page: pass ``cursor=""``)."""
        return url_for("views.calls", state=self.state, **self.params(**changes))


def _number(args: MultiDict[str, str], name: str, default: int, lowest: int, highest: int) -> int:
    raw = args.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        abort(400, f"{name} must be a whole number, not {raw!r}.")
    if not lowest <= value <= highest:
        abort(400, f"{name} must be from {lowest:,} to {highest:,}, not {value:,}.")
    return value
