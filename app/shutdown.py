"""Stopping cleanly (issue 26): SIGTERM stops the embedded service while it trains.

The app's shutdown sets its embedded worker's stop event (in its thread, or told over the
worker process's pipe); a job of that worker checks it between epochs (`check`) and raises
`Interrupted`, which puts its work back as it was (a model back to `queued`, claimed deletion
tasks back to `queued` with no attempt counted), so the next start resumes it. One long array
operation (a topic model's solve) is not interruptible: it ends first, which is why the memory
budget refuses what would not fit."""

from __future__ import annotations

import threading

_local = threading.local()


class Interrupted(RuntimeError):
    """The process is shutting down: the job stops here and its work is resumed later."""


def bind(stopping: threading.Event) -> None:
    """Make `stopping` the event this thread's jobs check (the embedded worker's loop calls
    it; a thread that never binds one, like an RQ worker or a test, is never interrupted)."""
    _local.stopping = stopping


def check() -> None:
    """Raise Interrupted once this thread's worker is shutting down."""
    stopping: threading.Event | None = getattr(_local, "stopping", None)
    if stopping is not None and stopping.is_set():
        raise Interrupted("the service is shutting down; the job resumes on the next start")
