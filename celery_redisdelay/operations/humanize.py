"""Times, durations and sizes as an operator reads them; shared by the command line and the dashboard."""

from __future__ import annotations

from typing import Any


def span(seconds: float) -> str:
    """A duration in its two largest units: ``250ms``, ``42s``, ``5m 3s``, ``2h 5m``, ``3d 4h``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    whole = int(seconds)
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if whole >= size:
            rest = whole % size // smaller_size
            return f"{whole // size}{unit}" + (f" {rest}{smaller}" if rest else "")
    return f"{whole}s"


def relative(seconds: float) -> str:
    """Seconds from now (negative: past) as ``in 5m`` or ``3s ago``."""
    if abs(seconds) < 0.0005:
        return "now"
    return f"in {span(seconds)}" if seconds > 0 else f"{span(-seconds)} ago"


def size_text(size: int) -> str:
    """A size in bytes, KiB, MiB or GiB."""
    if size < 1024:
        return f"{size:,} B"
    scaled = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        scaled /= 1024
        if scaled < 1024 or unit == "GiB":
            break
    return f"{scaled:,.1f} {unit}"


def deliveries(done: Any, limit: Any, of: str = "/", unlimited: str = "") -> str:
    """Deliveries so far and the most allowed (0 or missing: no limit)."""
    return f"{done}{of}{limit}" if limit else f"{done}{unlimited}"


def lock_text(lock: dict[str, Any]) -> str:
    """The lock of a call as ``admin.describe`` gives it, in a line."""
    if lock["name"] is None:
        return str(lock["note"])
    held = "free"
    if lock["held"]:
        held = "held" if lock["expires_in_ms"] is None else f"held for {span(lock['expires_in_ms'] / 1000)} more"
    waiting = ", this call among them" if lock["waiting"] else ""
    return f"{lock['name']} ({held}, {lock['waiters']} waiting{waiting})"


def compact(count: float) -> str:
    """A count in at most four characters for a chart's axis: ``950``, ``1.2k``, ``35k``, ``1M``."""
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1000, "k")):
        if count >= size:
            scaled = count / size
            return f"{scaled:.1f}".rstrip("0").rstrip(".") + suffix if scaled < 10 else f"{scaled:.0f}{suffix}"
    return f"{count:.0f}"
