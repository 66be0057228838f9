"""A clock that moves only when a test advances it (app/core/clock.py): what waits on it
wakes on the event it waits for, or once the test has moved the clock past its deadline."""

from __future__ import annotations

import threading


class ManualClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._moved = threading.Condition()

    def now(self) -> float:
        with self._moved:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._moved:
            self._now += seconds
            self._moved.notify_all()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        with self._moved:
            deadline = self._now + max(0.0, seconds)
            while not event.is_set() and self._now < deadline:
                self._moved.wait(0.005)  # an event's set does not notify: looked at often
            return event.is_set()
