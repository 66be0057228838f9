"""The worker's garbage collection, kept out of the update path. A resident session holds
a few hundred thousand Python objects; a full collection walks them all (70–130 ms at 50,000
rows) and CPython starts one whenever enough allocations have piled up, so it landed inside a
random update: the first deletion after a test-row erasure took ~300 ms instead of ~60 ms
(bench.plaintext_costs, issue 54). After each job what survived it is frozen
(`gc.freeze`: later collections skip it), and the full collection runs once the worker has
been idle for a moment, where it delays nobody."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Iterator

IDLE_SECONDS = 0.5  # idle this long after a job: collect everything then


class Collector:
    """`after_job` freezes what a job left; `idle(seconds)` collects everything once per idle
    spell (unfreezing first, so cyclic garbage a job left is reclaimed there, not never)."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS) -> None:
        self.idle_seconds = idle_seconds
        self._dirty = False
        self._lock = threading.Lock()

    def after_job(self) -> None:
        with self._lock:
            gc.collect(1)  # the young generations: cheap, and most of a job's cycles
            gc.freeze()
            self._dirty = True

    def idle(self, seconds: float) -> None:
        if seconds < self.idle_seconds or not self._dirty:
            return
        with self._lock:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self._dirty = False

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
    alone, walked them over and over: 40 % of reading a million rows (issue 55)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
