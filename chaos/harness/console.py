"""What a chaos run says as it goes: one line at a time, with the seconds since the runner started."""

from __future__ import annotations

import time

_started = time.monotonic()


def say(text: str) -> None:
    print(f"[{time.monotonic() - _started:6.1f}s] {text}", flush=True)


def seconds_since_start() -> float:
    return round(time.monotonic() - _started, 1)
