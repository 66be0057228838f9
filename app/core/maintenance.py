"""Maintenance: the periodic tasks that put right what a lost signal, a crash or a missed
publication left (`dispatch` only signals). One daemon thread runs a list of
`PeriodicTask`s, each at its own period; a task that raises is logged and runs again at its
next turn. The database is the record, so every task may run late, twice or concurrently
with another process's without harm.

- reconcile: requeue expired leases, signal the models with work, the audits to run, and
  discard registrations a dead process abandoned (the queue may have lost any signal);
- publish: sign and publish a checkpoint the witnesses missed (app/core/ledger/publish.py);
- blob sweep: delete objects no row references (a crash between a write and its commit);
- token merge: move appended rows' tokens into the main indexes (app/core/services/token_merge.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from app.core.db.tables import DeletionTask, LearnTask, Model, PrivacyAudit, task_is_due, utcnow
from app.core.dispatch import AUDIT, DELETE, TRAIN, Dispatcher
from app.core.runtime import Runtime
from app.core.services import appends, registration, token_merge
from app.core.settings import Settings
from app.core.states import AuditStatus, ModelStatus, TaskStatus

log = logging.getLogger("lethe.maintenance")

TICK_SECONDS = 0.5  # how often the thread looks for a task that is due (at most a period)


@dataclass(frozen=True)
class PeriodicTask:
    """`run` every `every` seconds; the first run at start, or one period later if `later`."""

    name: str
    every: float
    run: Callable[[], object]
    later: bool = False


def reconcile(session: Session, settings: Settings) -> dict[str, list[int]]:
    """Requeue expired leases and list the models that need a training or deletion job (a
    task waiting out its retry backoff is signalled once it is due), the audits to run and
    the registrations abandoned by a process that died (to discard)."""
    now = utcnow()
    session.execute(
        update(DeletionTask)
        .where(DeletionTask.status == TaskStatus.running, DeletionTask.lease_expires_at < now)
        .values(status=TaskStatus.queued, lease_owner=None, lease_expires_at=None)
    )
    free = or_(Model.lease_expires_at.is_(None), Model.lease_expires_at < now)
    to_train = session.scalars(
        select(Model.id).where(Model.status.in_((ModelStatus.queued, ModelStatus.training)), free)
    ).all()
    to_delete = session.scalars(
        select(DeletionTask.model_id)
        .distinct()
        .join(Model, Model.id == DeletionTask.model_id)
        .where(
            DeletionTask.status == TaskStatus.queued,
            task_is_due(now),
            Model.status == ModelStatus.ready,
            free,
        )
    ).all()
    to_learn = session.scalars(
        select(LearnTask.model_id)
        .distinct()
        .join(Model, Model.id == LearnTask.model_id)
        .where(LearnTask.status == TaskStatus.queued, Model.status == ModelStatus.ready, free)
    ).all()
    stale = now - timedelta(seconds=settings.job_timeout_seconds)
    to_audit = session.scalars(
        select(PrivacyAudit.id).where(
            or_(
                PrivacyAudit.status == AuditStatus.queued,
                (PrivacyAudit.status == AuditStatus.running) & (PrivacyAudit.started_at < stale),
            )
        )
    ).all()
    return {
        "train": sorted(to_train),
        "delete": sorted({*to_delete, *to_learn}),  # the deletion job learns appends too
        "audit": sorted(to_audit),
        "discard": registration.abandoned(session, now, settings.registration_stale_seconds),
        "discard_appends": appends.abandoned(session, now, settings.registration_stale_seconds),
    }


def reconcile_and_signal(runtime: Runtime, dispatcher: Dispatcher) -> dict[str, list[int]]:
    """`reconcile`, then discard the abandoned registrations and signal the rest."""
    with runtime.db.write() as session:
        work = reconcile(session, runtime.settings)
    for dataset_id in work["discard"]:
        log.warning("dataset %s: its registration stopped; discarding it", dataset_id)
        registration.discard(runtime, dataset_id, registration.ABANDONED)
    for append_id in work["discard_appends"]:
        log.warning("append %s: it stopped; discarding it", append_id)
        appends.discard(runtime, append_id, appends.ABANDONED)
    for model_id in work["train"]:
        dispatcher.enqueue(TRAIN, model_id)
    for model_id in work["delete"]:
        dispatcher.enqueue(DELETE, model_id)
    for audit_id in work["audit"]:
        dispatcher.enqueue(AUDIT, audit_id)
    return work


def maintenance_tasks(runtime: Runtime, dispatcher: Dispatcher) -> list[PeriodicTask]:
    """What an API with an embedded worker, or a `lethe worker`, keeps doing."""
    settings = runtime.settings
    return [
        PeriodicTask(
            "reconcile",
            settings.reconcile_seconds,
            lambda: reconcile_and_signal(runtime, dispatcher),
        ),
        PeriodicTask("publish", settings.reconcile_seconds, runtime.publisher.now),
        PeriodicTask(
            "blob sweep",
            settings.blob_sweep_seconds,
            lambda: runtime.blobs.sweep(settings.blob_orphan_grace_seconds),
            later=True,
        ),
        PeriodicTask(
            "token merge",
            settings.reconcile_seconds,
            lambda: token_merge.merge(runtime.db, settings.token_merge_rows),
            later=True,
        ),
    ]


class Maintenance:
    """Runs `tasks` in one daemon thread, each when due, until stopped."""

    def __init__(self, tasks: list[PeriodicTask]) -> None:
        self.tasks = tasks
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lethe-maintenance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        now = time.monotonic()
        due = [now + task.every if task.later else now for task in self.tasks]
        while not self._stop.is_set():
            for i, task in enumerate(self.tasks):
                if time.monotonic() >= due[i]:
                    self._run(task)
                    due[i] = time.monotonic() + task.every
            self._stop.wait(max(0.0, min(min(due) - time.monotonic(), TICK_SECONDS)))

    @staticmethod
    def _run(task: PeriodicTask) -> None:
        try:
            task.run()
        except Exception:
            log.warning("%s failed; it runs again in %.0f s", task.name, task.every, exc_info=True)
