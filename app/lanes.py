"""Deletions first (issue 53): the embedded worker runs deletion jobs in a lane of their own,
never queued behind training or an audit, and while one runs the background lane's job waits
at its next check (app/shutdown.py), so a deletion certifies about as fast as when idle.

Each lane is a thread with its own queue; one signal per (job, model) waits
(app/signals.py, through `on_taken`). The distributed mode's equivalent is RQ's queue order:
a `lethe worker` listens on the deletions queue first (app/dispatch.py, workers/worker.py).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from app import shutdown
from app.signals import Signal

log = logging.getLogger("lethe.lanes")


class Lanes:
    """Two job threads: the `foreground` jobs (deletions), and everything else."""

    def __init__(
        self,
        stopping: threading.Event,
        run: Callable[..., None],
        on_taken: Callable[[Signal], None],
        foreground: frozenset[str],
        name: str = "lethe-worker",
    ) -> None:
        self._stopping, self._run, self._on_taken = stopping, run, on_taken
        self._foreground = foreground
        self._queues: dict[str, queue.Queue[Signal | None]] = {
            "deletions": queue.Queue(),
            "background": queue.Queue(),
        }
        self._threads = [
            threading.Thread(target=self._loop, args=(lane,), name=f"{name}-{lane}", daemon=True)
            for lane in self._queues
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def put(self, item: Signal) -> None:
        self._queues[self.lane_of(item[0])].put(item)

    def lane_of(self, job: str) -> str:
        """The lane a job runs in: "deletions" for a foreground job, else "background"."""
        return "deletions" if job in self._foreground else "background"

    def depth(self) -> int:
        return sum(q.qsize() for q in self._queues.values())

    def alive(self) -> bool:
        return all(t.is_alive() for t in self._threads)

    def stop(self, timeout: float = 30.0) -> None:
        """Let each lane's running job stop at its next check (the caller set `stopping`),
        then wait for both threads."""
        for q in self._queues.values():
            q.put(None)
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=timeout)

    def _loop(self, lane: str) -> None:
        shutdown.bind(self._stopping, background=lane == "background")
        jobs = self._queues[lane]
        while (item := jobs.get()) is not None:
            if self._stopping.is_set():
                continue  # stopping: what waits is signalled again at the next start
            self._on_taken(item)
            try:
                if lane == "deletions":
                    with shutdown.priority():
                        self._run(item[0], *item[1])
                else:
                    self._run(item[0], *item[1])
            except Exception:  # the reconciler re-signals anything left queued
                log.exception("%s job %s%s failed", lane, item[0], item[1])
