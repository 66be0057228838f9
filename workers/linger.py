"""One model's deletion work under its lease: claiming its next batch,
asking whether more is due, and, in distributed mode, lingering on the lease after the last
batch so that the next deletion runs here, on the warm session. The due lists' Redis keys are
`app.core.dispatch.DueList`'s; the lease is the truth: if this worker dies, the lease expires and
any worker takes over."""

from __future__ import annotations

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core import shutdown
from app.core.db.tables import DeletionTask, task_is_due, utcnow
from app.core.states import TaskStatus
from workers import claim
from workers.context import JobContext
from workers.lease import ModelLease
from workers.values import ClaimedTask

STICKY_POLL_SECONDS = 0.1  # the fallback look when no wake-up comes through Redis


class Linger:
    """The deletion work of `model_id` for one job of `ctx`'s worker."""

    def __init__(self, ctx: JobContext, model_id: int) -> None:
        self.ctx, self.model_id = ctx, model_id

    @property
    def lingers(self) -> bool:
        """Whether this worker keeps the lease after its last batch (distributed, with
        LETHE_STICKY_SECONDS > 0)."""
        return self.ctx.due is not None

    def forget_due(self) -> None:
        """Before a claim, empty the model's due list: the claim covers every push before it."""
        if self.ctx.due is not None:
            self.ctx.due.forget(self.model_id)

    def claim_in(self, session: Session, lease: ModelLease) -> list[ClaimedTask]:
        """Claim the model's next batch in the caller's transaction (none unless it is ready)."""
        size = self.ctx.settings.max_batch_requests
        return claim.claim_tasks(session, self.model_id, size, lease.deadline())

    def claim(self, lease: ModelLease) -> list[ClaimedTask]:
        """`claim_in` in a statement of its own (a claim lost in a crash expires with the
        lease)."""
        with self.ctx.db.single(durable=False) as session:
            return self.claim_in(session, lease)

    def has_due(self) -> bool:
        """Whether a queued task of the model is due now (not waiting out a retry backoff)."""
        now = utcnow()
        with self.ctx.db.read() as session:
            found = session.scalar(
                select(DeletionTask.id)
                .where(
                    DeletionTask.model_id == self.model_id,
                    DeletionTask.status == TaskStatus.queued,
                    task_is_due(now),
                )
                .limit(1)
            )
        return found is not None

    def linger(self) -> bool:
        """Keep the lease for `sticky_seconds` after the model's last batch, watching for its
        next due task (True when one came). Another worker signalled meanwhile finds the model
        busy, so the next update runs here, on the warm session. The API pushes to the
        model's due list after committing a deletion: the worker blocks on it and, when woken,
        goes straight to its claim; it looks at the database itself every
        STICKY_POLL_SECONDS, for a push lost with Redis (a fixed sleep between looks cost a
        deletion half of it on average). The caller has just looked."""
        if self.ctx.due is None:
            return False
        deadline = time.monotonic() + self.ctx.settings.sticky_seconds
        while (left := deadline - time.monotonic()) > 0:
            shutdown.check()
            if self.ctx.due.wait(self.model_id, min(left, STICKY_POLL_SECONDS)):
                return True
            if self.has_due():
                return True
        return False
