"""Claiming a model's deletion tasks and giving them back (DESIGN §6), the first and the
last unit of work of an update: `claim_tasks` takes the model's next batch under its lease,
`release_tasks` puts a batch back unpenalised, `check_lease` is the guard of every commit."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.db.tables import (
    DeletionTask,
    Model,
    utcnow,
)
from app.core.states import ModelStatus, RequestStatus, TaskStatus
from workers import statements as sql
from workers.lease import WORKER_ID, LeaseLost
from workers.values import ClaimedTask


def claim_tasks(
    session: Session, model_id: int, limit: int, deadline: datetime
) -> list[ClaimedTask]:
    """Mark up to `limit` due queued tasks of the model running under our lease (coalescing);
    none unless the model is ready."""
    conn, now = session.connection(), utcnow()
    find = {
        "model": model_id,
        "queued": TaskStatus.queued,
        "ready": ModelStatus.ready,
        "now": now,
        "limit": limit,
    }
    claim = {"running": TaskStatus.running, "owner": WORKER_ID, "deadline": deadline, "now": now}
    start = {
        "request_queued": RequestStatus.queued,
        "request_running": RequestStatus.running,
        "now": now,
    }
    if conn.dialect.name == "postgresql":  # one statement
        rows = conn.execute(sql.CLAIM_AT_ONCE, find | claim | start).all()
    else:
        rows = conn.execute(sql.CLAIMABLE, find).all()
        if not rows:
            return []
        conn.execute(sql.CLAIM_TASKS, claim | {"ids": [r.id for r in rows]})
        conn.execute(sql.START_REQUESTS, start | {"ids": sorted({r.request_id for r in rows})})
    return [
        ClaimedTask(r.id, r.request_id, list(r.sample_ids), r.method, r.epsilon, r.delta)
        for r in rows
    ]


def release_tasks(
    session: Session, task_ids: list[int], delay_seconds: float = 0, why: str | None = None
) -> None:
    """Put claimed tasks back to queued, due after `delay_seconds`, their attempt not counted:
    the job was interrupted by a shutdown (app/core/shutdown.py) or a storage fault
    (app/core/storage/faults.py), not failed; `why` is what the request shows meanwhile."""
    due = utcnow() + timedelta(seconds=delay_seconds) if delay_seconds else None
    for task in session.scalars(select(DeletionTask).where(DeletionTask.id.in_(task_ids))):
        if task.status == TaskStatus.running and task.lease_owner == WORKER_ID:
            task.status, task.not_before = TaskStatus.queued, due
            task.error = why
            task.lease_owner = task.lease_expires_at = None
            task.attempts = max(0, task.attempts - 1)


def check_lease(session: Session, model_id: int) -> Model:
    """The model row, if this worker still holds its lease (else LeaseLost: do not commit)."""
    model = session.get(Model, model_id)
    if model is None or model.lease_owner != WORKER_ID:
        owner = model.lease_owner if model is not None else None
        raise LeaseLost(f"model {model_id} is now leased by {owner}")
    return model
