"""What a batch's trace continues (app/core/tracing.py): each request's `traceparent`,
written by the POST that made it, and when it was committed (the queue wait starts there)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select

from app.core import tracing
from app.core.db.chunks import chunked
from app.core.db.session import Database
from app.core.db.tables import DeletionRequest
from workers.values import ClaimedTask


def of_requests(db: Database, tasks: list[ClaimedTask]) -> list[tuple[int, str | None, datetime]]:
    """(request id, traceparent, committed at) of the batch's requests, oldest first; empty,
    with no read, when this process does not trace."""
    if not tracing.enabled():
        return []
    ids = sorted({t.request_id for t in tasks})
    r = DeletionRequest
    rows: list[tuple[int, str | None, datetime]] = []
    with db.read() as session:
        for chunk in chunked(ids):
            found = session.execute(
                select(r.id, r.trace_context, r.created_at).where(r.id.in_(chunk))
            )
            rows += [(i, c, at) for i, c, at in found]
    return sorted(rows)
