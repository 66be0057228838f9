"""A worker's exclusive, expiring claim on a model, renewed by a heartbeat thread.

Works the same on SQLite and PostgreSQL: a conditional UPDATE takes the claim, so two workers
never run one model's jobs at once; a worker that dies simply stops renewing.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType

from sqlalchemy import or_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from app.core.db.session import database, rowcount
from app.core.db.tables import DeletionTask, Model, WorkerHeartbeat, utcnow
from app.core.settings import Settings
from app.core.states import TaskStatus

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaseLost(RuntimeError):
    """Another worker took the model after our lease expired; our result must not commit."""


def beat(url: str, mode: str) -> None:
    """Record that this worker process is alive."""
    with database(url).write(durable=False) as session:
        dialect = session.get_bind().dialect.name
        ins = (pg_insert if dialect == "postgresql" else sqlite_insert)(WorkerHeartbeat)
        now = utcnow()
        session.execute(
            ins.values(
                id=WORKER_ID,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                mode=mode,
                started_at=now,
                heartbeat_at=now,
            ).on_conflict_do_update(index_elements=["id"], set_={"heartbeat_at": now})
        )


class ModelLease:
    """`with ModelLease(...) as lease:` then `if lease.held:`; renewed until the block ends.

    `on_take`, when given, runs in the transaction that takes the lease, only if it was
    taken, and its result is `lease.taken` (a deletion job claims its first batch there:
    one transaction instead of two per update)."""

    def __init__(
        self,
        url: str,
        model_id: int,
        seconds: float,
        heartbeat: float,
        mode: str = "worker",
        on_take: Callable[[Session, ModelLease], object] | None = None,
    ) -> None:
        self.url, self.model_id, self.seconds, self.heartbeat = url, model_id, seconds, heartbeat
        self.mode = mode
        self.held = False
        self.on_take = on_take
        self.taken: object | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ModelLease:
        self.held = self._claim(take=True)
        if self.held:
            self._thread = threading.Thread(
                target=self._renew_loop, daemon=True, name=f"lease-{self.model_id}"
            )
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.held:
            with database(self.url).write(durable=False) as session:
                session.execute(
                    update(Model)
                    .where(Model.id == self.model_id, Model.lease_owner == WORKER_ID)
                    .values(lease_owner=None, lease_expires_at=None)
                )

    def deadline(self):
        return utcnow() + timedelta(seconds=self.seconds)

    def _claim(self, take: bool) -> bool:
        now = utcnow()
        mine = Model.lease_owner == WORKER_ID
        cond = (
            or_(mine, Model.lease_owner.is_(None), Model.lease_expires_at < now) if take else mine
        )
        with database(self.url).write(durable=False) as session:
            result = session.execute(
                update(Model)
                .where(Model.id == self.model_id, cond)
                .values(lease_owner=WORKER_ID, lease_expires_at=self.deadline())
            )
            if rowcount(result) == 1 and take and self.on_take is not None:
                self.taken = self.on_take(session, self)
            if rowcount(result) == 1 and not take:
                session.execute(
                    update(DeletionTask)
                    .where(
                        DeletionTask.model_id == self.model_id,
                        DeletionTask.status == TaskStatus.running,
                        DeletionTask.lease_owner == WORKER_ID,
                    )
                    .values(lease_expires_at=self.deadline())
                )
            return rowcount(result) == 1

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                beat(self.url, self.mode)
                if not self._claim(take=False):
                    return  # lost: the commit's own check will refuse our result
            except Exception:  # database briefly unreachable: try again next beat
                continue


def lease_for(
    settings: Settings,
    model_id: int,
    on_take: Callable[[Session, ModelLease], object] | None = None,
) -> ModelLease:
    """The model's lease as the settings configure it (its database, its terms)."""
    return ModelLease(
        settings.resolved_database_url,
        model_id,
        settings.lease_seconds,
        settings.heartbeat_seconds,
        "embedded" if settings.embedded else "rq",
        on_take,
    )
