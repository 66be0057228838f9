"""The deletion queue as numbers, for /metrics."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db.tables import DeletionTask, utcnow
from app.core.states import TaskStatus


def queue_stats(session: Session) -> dict[str, float]:
    """Queued task count and the age in seconds of the oldest queued one."""
    n, oldest = session.execute(
        select(func.count(), func.min(DeletionTask.created_at)).where(
            DeletionTask.status == TaskStatus.queued
        )
    ).one()
    age = (utcnow() - oldest).total_seconds() if oldest is not None else 0.0
    return {"queued": float(n), "oldest_age_seconds": max(age, 0.0)}
