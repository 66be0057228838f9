"""Deletions first: the embedded worker takes a waiting deletion before any queued
training or audit, and a running training or audit runs waiting deletions at its next check
(`shutdown.check`: a training's next epoch, an audit's next stage), in the same thread, then
goes on. So a deletion never waits behind a queue of background jobs, and waits at most for
one epoch or stage of the running one.

One thread runs every job, as before: the jobs' torch work stays in the thread that always ran
it (a second job thread made a logistic retrain slower through torch's per-thread
OpenMP teams). One signal per (job, model) waits (app/core/signals.py, through
`on_taken`). The distributed mode's equivalent is RQ's queue order: a `lethe worker` listens
on the deletions queue first (app/core/dispatch.py, workers/worker.py).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable

from app.core import shutdown
from app.core.signals import Signal

log = logging.getLogger("lethe.lanes")


class Lanes:
    """Waiting jobs in two lanes, `foreground` (deletions) taken first, run by `serve`."""

    def __init__(
        self,
        stopping: threading.Event,
        run: Callable[..., None],
        on_taken: Callable[[Signal], None],
        foreground: frozenset[str],
    ) -> None:
        self._stopping, self._run, self._on_taken = stopping, run, on_taken
        self._foreground = foreground
        self._waiting: dict[bool, collections.deque[Signal]] = {
            True: collections.deque(),
            False: collections.deque(),
        }
        self._changed = threading.Condition()
        self._closed = False

    def put(self, item: Signal) -> None:
        with self._changed:
            self._waiting[item[0] in self._foreground].append(item)
            self._changed.notify_all()

    def depth(self) -> int:
        with self._changed:
            return sum(len(q) for q in self._waiting.values())

    def close(self) -> None:
        """`serve` returns once its running job ends (the caller set `stopping`)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def serve(self, give_way: Callable[[float], bool] | None = None) -> bool:
        """Run jobs in the calling thread until `close` or `stopping`: foreground first; a
        background job's checks run the foreground jobs that wait meanwhile. `give_way(idle
        seconds)`, asked between jobs and while idle, ends it early: True then (the jobs still
        waiting were not taken, so the dispatcher sends them to the next process)."""
        shutdown.bind(self._stopping, preempt=self._run_foreground)
        idle_since = time.monotonic()
        while True:
            with self._changed:
                if not (self._closed or self._stopping.is_set() or self.depth()):
                    self._changed.wait(0.5)
                if self._closed or self._stopping.is_set():
                    return False
                item: Signal | None = None
                if self.depth():
                    foreground = bool(self._waiting[True])
                    item = self._waiting[foreground].popleft()
            if item is None:
                if give_way is not None and give_way(time.monotonic() - idle_since):
                    return True
                continue
            self._one(item, background=not foreground)
            idle_since = time.monotonic()
            if give_way is not None and give_way(0.0):
                return True

    def _run_foreground(self) -> None:
        """At a background job's check: the foreground jobs waiting now, one by one."""
        while not self._stopping.is_set():
            with self._changed:
                if not self._waiting[True]:
                    return
                item = self._waiting[True].popleft()
            self._one(item, background=False)

    def _one(self, item: Signal, background: bool) -> None:
        self._on_taken(item)
        try:
            with shutdown.lane(background):
                self._run(item[0], *item[1])
        except Exception:  # the reconciler re-signals anything left queued
            log.exception("job %s%s failed", item[0], item[1])
