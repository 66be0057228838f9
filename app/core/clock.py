"""The time a background task waits by, passed in so that a test can move it: `SYSTEM` is
the monotonic clock; a test's manual clock (tests/support/clock.py) moves only when told."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Until `event` is set or `seconds` have passed on this clock; whether it was set."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))


SYSTEM: Clock = SystemClock()
