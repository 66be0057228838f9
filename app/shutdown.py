"""Stopping cleanly (issue 26): SIGTERM stops the embedded service while it trains.

The app's shutdown sets its embedded worker's stop event (in its thread, or told over the
worker process's pipe); a job of that worker checks it between epochs (`check`) and raises
`Interrupted`, which puts its work back as it was (a model back to `queued`, claimed deletion
tasks back to `queued` with no attempt counted), so the next start resumes it. One long array
operation (a topic model's solve) is not interruptible: it ends first, which is why the memory
budget refuses what would not fit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_local = threading.local()
_priority = threading.Condition()
_priority_running = 0


class Interrupted(RuntimeError):
    """The process is shutting down: the job stops here and its work is resumed later."""


def bind(stopping: threading.Event, background: bool = False) -> None:
    """Make `stopping` the event this thread's jobs check (the embedded worker's loop calls
    it; a thread that never binds one, like an RQ worker or a test, is never interrupted).
    A `background` thread's jobs (training, audits) also pause at each check while a
    deletion runs in this process (issue 53: deletions first)."""
    _local.stopping = stopping
    _local.background = background


def check() -> None:
    """Raise Interrupted once this thread's worker is shutting down; in a background lane,
    first wait while a deletion runs (`priority`)."""
    yield_to_deletions()
    stopping: threading.Event | None = getattr(_local, "stopping", None)
    if stopping is not None and stopping.is_set():
        raise Interrupted("the service is shutting down; the job resumes on the next start")


def yield_to_deletions() -> None:
    """In a background lane, wait while a deletion runs in this process (or until stopping);
    elsewhere return at once. For a job's points between stages that must not raise."""
    if not getattr(_local, "background", False):
        return
    stopping: threading.Event | None = getattr(_local, "stopping", None)
    with _priority:
        while _priority_running and not (stopping is not None and stopping.is_set()):
            _priority.wait(0.5)


@contextmanager
def priority() -> Iterator[None]:
    """Mark a deletion running in this process: background jobs wait at their next `check`,
    so the deletion has the process's cores to itself."""
    global _priority_running
    with _priority:
        _priority_running += 1
    try:
        yield
    finally:
        with _priority:
            _priority_running -= 1
            _priority.notify_all()
