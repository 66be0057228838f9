"""Stopping cleanly (issue 26): SIGTERM stops the embedded service while it trains.

The app's shutdown sets `STOPPING`; a job checks it between epochs (`check`) and raises
`Interrupted`, which puts its work back as it was (a model back to `queued`, deletion tasks
left to their lease, which expires and requeues them with no attempt counted), so the next
start resumes it. One long array operation (a topic model's solve) is not interruptible: it
ends first, which is why the memory budget refuses what would not fit."""

from __future__ import annotations

import threading

STOPPING = threading.Event()


class Interrupted(RuntimeError):
    """The process is shutting down: the job stops here and its work is resumed later."""


def check() -> None:
    """Raise Interrupted once the process is shutting down."""
    if STOPPING.is_set():
        raise Interrupted("the service is shutting down; the job resumes on the next start")
