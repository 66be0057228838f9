"""Stopping cleanly: SIGTERM stops the embedded service while it trains.

The app's shutdown sets its embedded worker's stop event (in its thread, or told over the
worker process's pipe); a job of that worker checks it between epochs (`check`) and raises
`Interrupted`, which puts its work back as it was (a model back to `queued`, claimed deletion
tasks back to `queued` with no attempt counted), so the next start resumes it. One long array
operation (a topic model's solve) is not interruptible: it ends first, which is why the memory
budget refuses what would not fit."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_local = threading.local()


class Interrupted(RuntimeError):
    """The process is shutting down: the job stops here and its work is resumed later."""


def bind(stopping: threading.Event, preempt: Callable[[], None] | None = None) -> None:
    """Make `stopping` the event this thread's jobs check (the embedded worker's loop calls
    it; a thread that never binds one, like an RQ worker or a test, is never interrupted).
    `preempt`: what a background job's checks run first (app/core/lanes.py: the deletions that
    wait, deletions first)."""
    _local.stopping = stopping
    _local.preempt = preempt


@contextmanager
def lane(background: bool) -> Iterator[None]:
    """Mark the job this thread runs now as a background one (training, an audit) or not."""
    before = getattr(_local, "background", False)
    _local.background = background
    try:
        yield
    finally:
        _local.background = before


def check() -> None:
    """Run the deletions that wait (in a background job), then raise Interrupted once this
    thread's worker is shutting down."""
    run_waiting_deletions()
    stopping: threading.Event | None = getattr(_local, "stopping", None)
    if stopping is not None and stopping.is_set():
        raise Interrupted("the service is shutting down; the job resumes on the next start")


def sleep(seconds: float) -> None:
    """Wait `seconds`, or raise Interrupted as soon as this thread's worker is shutting down
    (a thread without one just waits)."""
    if seconds <= 0:
        return
    stopping: threading.Event | None = getattr(_local, "stopping", None)
    if stopping is None:
        threading.Event().wait(seconds)
    elif stopping.wait(seconds):
        raise Interrupted("the service is shutting down; the job resumes on the next start")


def run_waiting_deletions() -> None:
    """In a background job, run the deletions that wait now, here, then return; elsewhere
    return at once. For a job's points between stages that must not raise (an audit's)."""
    preempt: Callable[[], None] | None = getattr(_local, "preempt", None)
    if preempt is not None and getattr(_local, "background", False):
        preempt()
