"""The signals waiting for an embedded worker (thread or process): at most one per job and
arguments, since one run of a job sees all the work that is due for it."""

from __future__ import annotations

import threading

Signal = tuple[str, tuple[int, ...]]


class WaitingSignals:
    """A thread-safe set of signals sent and not yet taken by the worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: set[Signal] = set()

    def add(self, signal: Signal) -> bool:
        """Note `signal` as waiting; False if it already was (nothing to send)."""
        with self._lock:
            if signal in self._waiting:
                return False
            self._waiting.add(signal)
            return True

    def taken(self, signal: Signal) -> None:
        """The worker took it: a new signal for the same work may be sent."""
        with self._lock:
            self._waiting.discard(signal)

    def all(self) -> list[Signal]:
        with self._lock:
            return list(self._waiting)

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)
