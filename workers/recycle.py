"""When a worker process gives way to a fresh one.

A worker decrypts rows to train and to update, and Python frees those copies without zeroing
them, so a long-lived worker kept the rows of people erased long ago. A process that has lived
through an erasure is replaced: the kernel zeroes its pages before any other use. It gives way
once idle for a quarter of the plaintext TTL after the erasure (a burst of deletions is not
split), and at the latest half the TTL after it, at a job boundary. The embedded worker
process exits and its parent starts another; `lethe worker` re-executes itself. Either way the
successor first warms the resident sessions its predecessor held (`workers.jobs.warm_model`),
so the next deletion does not pay for the change.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC

from sqlalchemy import func, select

from app.core.db.session import Database
from app.core.db.tables import DeletionRequest, utcnow
from app.core.states import RequestStatus
from app.core.storage.erasure import erasures_here

log = logging.getLogger("lethe.recycle")


class Recycle:
    """Whether this process has lived through an erasure, and is due to give way."""

    def __init__(self, db: Database, ttl_seconds: float) -> None:
        self.db, self.ttl = db, ttl_seconds
        self.started = utcnow()
        self.erasure_at: float | None = None  # monotonic time of the first erasure seen
        self._polled = float("-inf")
        self._erasures_at_start = erasures_here(self.db)

    def due(self, idle_for: float) -> bool:
        """After `idle_for` seconds without a job (0 between jobs): give way now? Between
        jobs it reads only this process's own erasures; idle, also the database's."""
        if self.erasure_at is None and erasures_here(self.db) > self._erasures_at_start:
            self.erasure_at = time.monotonic()
        if idle_for > 0:
            self._poll()
        if self.erasure_at is None:
            return False
        age = time.monotonic() - self.erasure_at
        return idle_for >= self.idle_seconds or age >= self.ttl / 2

    @property
    def idle_seconds(self) -> float:
        """How long a process that lived through an erasure waits idle before giving way."""
        return self.ttl / 4

    def _poll(self) -> None:
        """The newest finished deletion request (another process's erasure), read at most
        every few seconds."""
        now = time.monotonic()
        if self.erasure_at is not None or now - self._polled < min(self.ttl / 4, 5.0):
            return
        self._polled = now
        try:
            with self.db.read() as session:
                last = session.scalar(
                    select(func.max(DeletionRequest.finished_at)).where(
                        DeletionRequest.status == RequestStatus.done
                    )
                )
        except Exception:  # noqa: BLE001 - the database is away: ask again at the next poll
            log.debug("could not read the newest finished request", exc_info=True)
            return
        if last is not None and last.tzinfo is None:  # SQLite keeps naive UTC
            last = last.replace(tzinfo=UTC)
        if last is not None and last >= self.started:
            self.erasure_at = now - max(0.0, (utcnow() - last).total_seconds())
