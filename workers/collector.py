"""The worker's garbage collection, kept out of the update path. A resident session holds
a few hundred thousand Python objects; a full collection walks them all and CPython starts
one whenever enough allocations have piled up, so it landed inside a random update, several
times its usual length. After each job what survived it is frozen
(`gc.freeze`: later collections skip it), and the full collection runs once the worker has
been idle for a moment, where it delays nobody, unless a job is expected soon: an append's
POST is long enough for the collection to begin during it, and the learning it signalled
waited for the end of it."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator

IDLE_SECONDS = 0.5  # idle this long after a job: collect everything then
EXPECT_SECONDS = 10.0  # a job announced (`expect`) holds the idle collection off this long
HELD_MOST = 60.0  # ... unless what it would collect has waited this long (appends back to back)


class Collector:
    """`after_job` freezes what a job left; `idle(seconds)` collects everything once per idle
    spell (unfreezing first, so cyclic garbage a job left is reclaimed there, not never),
    not while a job `expect`ed may arrive."""

    def __init__(
        self, idle_seconds: float = IDLE_SECONDS, expect_seconds: float = EXPECT_SECONDS
    ) -> None:
        self.idle_seconds, self.expect_seconds = idle_seconds, expect_seconds
        self._dirty = False
        self._lock = threading.Lock()
        self._held_until = 0.0  # time.monotonic(): no idle collection before it
        self._dirty_since = 0.0  # when a job first left something since the last collection

    def expect(self) -> None:
        """A job is coming soon (the API began an append): hold the idle collection off until
        it has run (`after_job`) or `expect_seconds` have passed."""
        self._held_until = time.monotonic() + self.expect_seconds

    def after_job(self) -> None:
        with self._lock:
            gc.collect(1)  # the young generations: cheap, and most of a job's cycles
            gc.freeze()
            if not self._dirty:
                self._dirty, self._dirty_since = True, time.monotonic()
            self._held_until = 0.0  # the job expected has most likely run

    def idle(self, seconds: float) -> bool:
        """Collect everything if idle long enough, something is left to collect and no job
        is expected (or the garbage has waited HELD_MOST already); whether it did."""
        if seconds < self.idle_seconds or not self._dirty:
            return False
        now = time.monotonic()
        if now < self._held_until and now - self._dirty_since < HELD_MOST:
            return False
        with self._lock:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._dirty = False
        return True

    def around(self, run: Callable[..., None]) -> Callable[..., None]:
        """`run` followed by `after_job`, whether it raised or not."""

        def collected(*args: object) -> None:
            try:
                run(*args)
            finally:
                self.after_job()

        return collected


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """No automatic collection inside: a bulk read makes millions of short-lived tuples and
    rows (no cycles among them), and CPython's collections, started by the allocations
    alone, walked them over and over: 40 % of reading a million rows."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
