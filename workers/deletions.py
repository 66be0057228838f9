"""The deletion job: every due deletion task of a model, coalesced into batches, one update
each: claim → load → compute → store → commit → publish, a module each (workers/claim.py,
load.py, updates.py, store.py, commit.py, app/core/ledger/publish.py). One short read loads
what the computation needs, the computation runs with no transaction open, one write commits
the result (DESIGN §6); then the model learns appended rows once no deletion is due."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import cast

import torch
from sqlalchemy.orm import Session

from app.core import pause, shutdown, tracing
from app.core.db.tables import utcnow
from app.core.dispatch import DELETE, take_signal
from app.core.ledger.transparency import signing_key
from app.core.storage.erasure import compact_after_erasure
from app.core.storage.faults import fault_text, is_fault
from methods.compute import Release, UpdateInputs, method_for
from workers import claim, commit, learning, load, store, traces
from workers.advance import keep_resident
from workers.context import JobContext
from workers.data import database_key
from workers.lease import LeaseLost, ModelLease, lease_for
from workers.linger import Linger
from workers.metrics import (
    DEADLINES_MISSED,
    DELETIONS_PROCESSED,
    FALLBACKS,
    JOB_DURATION,
    STORAGE_FAULTS,
)
from workers.shards import shard_runner
from workers.updates import compute_storing
from workers.values import Batch, ClaimedTask, Fallback, Outcome, Unrecoverable

log = logging.getLogger("lethe.jobs")


def process_deletions(ctx: JobContext, model_id: int) -> str:
    """Apply every due deletion task of the model, coalesced, one update per batch, under its
    lease; after releasing it, look once more (a request committed while the lease was held
    may have had its signal dropped by a worker that saw the model busy)."""
    take_signal(DELETE, model_id)  # before reading: a request committed from now on re-signals
    work = Linger(ctx, model_id)
    work.forget_due()  # the claim below covers every push made before it
    device = ctx.device()
    applied = 0
    while True:
        with lease_for(ctx.settings, model_id, work.claim_in) as lease:
            if not lease.held:
                return f"busy (applied {applied})"
            done, ok = _apply_under_lease(ctx, work, lease, device)
            applied += done
            if not ok:
                return f"applied {applied}; a batch failed and will be retried"
        if not work.has_due():
            return f"applied {applied}"


def _apply_under_lease(
    ctx: JobContext, work: Linger, lease: ModelLease, device: torch.device
) -> tuple[int, bool]:
    """The batches due (the first claimed with the lease, in its own transaction), then, in
    distributed mode, the lease kept a while for the next one (`Linger.linger`): how many
    tasks were applied, and False when a batch failed."""
    applied, lingered = 0, False
    first: list[ClaimedTask] | None = cast(list[ClaimedTask], lease.taken)
    while True:
        done, ok, claimed = _apply_due(ctx, work, lease, first, device)
        applied, first = applied + done, None
        if not ok:
            return applied, False
        # due work this worker cannot claim (the model is not ready): stop lingering
        if (lingered and not claimed) or not work.linger():
            return applied, True
        lingered = True


def _apply_due(
    ctx: JobContext,
    work: Linger,
    lease: ModelLease,
    first: list[ClaimedTask] | None,
    device: torch.device,
) -> tuple[int, bool, bool]:
    """Claim and run batches while any is due: (tasks applied, no batch failed, any claimed)."""
    applied, claimed = 0, False
    while True:
        work.forget_due()  # the claim covers every push before it
        tasks, first = (first if first is not None else work.claim(lease)), None
        if not tasks:  # no deletion due: learn the appends waiting, if any
            learned, ok = learning.learn_due(ctx, work.model_id, device)
            return applied + learned, ok, claimed or learned > 0
        claimed = True
        if not _run_batch(ctx, work.model_id, tasks, device):
            return applied, False, claimed
        applied += len(tasks)
        if work.lingers and len(tasks) < ctx.settings.max_batch_requests:
            return applied, True, claimed  # all that was due; its wait wakes on a push since
        if not work.has_due():  # a read, not an empty claim's write; then appends waiting
            learned, ok = learning.learn_due(ctx, work.model_id, device)
            return applied + learned, ok, claimed


def _run_batch(
    ctx: JobContext, model_id: int, tasks: list[ClaimedTask], device: torch.device
) -> bool:
    """Load, compute, commit one batch. Returns False when it failed and was put back (or
    failed for good: then the exception propagates, so RQ records the job as failed)."""
    started = time.perf_counter()
    try:
        outcome = _apply_batch(ctx, model_id, tasks, device)
    except Exception as exc:
        return _failed(ctx, model_id, tasks, exc)
    compacting = time.perf_counter()
    compact_after_erasure(ctx.db, ctx.settings)  # destroyed keys (samples, purged versions) go
    if outcome is not None:  # new certificates: a checkpoint for the witnesses to cosign
        ctx.runtime.publisher.soon()
    JOB_DURATION.labels("erasure_compaction").observe(time.perf_counter() - compacting)
    JOB_DURATION.labels("process_deletions").observe(time.perf_counter() - started)
    return True


def _apply_batch(
    ctx: JobContext, model_id: int, tasks: list[ClaimedTask], device: torch.device
) -> Outcome | None:
    """The batch's update: one short read, the computation with no transaction open, one
    commit; its requests' waiters told. A failure leaves the resident session behind (it may
    no longer be at the current version)."""
    db, settings = ctx.db, ctx.settings
    sessions, where = ctx.resident_sessions(), database_key(db.engine)
    traced = traces.of_requests(db, tasks)  # nothing read when not tracing (core/tracing.py)
    with tracing.batch_trace(traced, {"lethe.model_id": model_id}):
        try:
            with tracing.span("deletion.load"), db.read() as session:  # no transaction
                batch, inputs = load.load_batch(session, ctx, model_id, tasks, device)
            with tracing.span("deletion.compute"):  # while computing: none open
                outcome, stored = _compute(ctx, batch, inputs, device)
            _hold_until(batch)
            pause.point(settings, "before-commit", model_id)  # (a crash: orphans, swept)
            version_id = _commit(ctx, batch, outcome, stored)
        except BaseException:
            sessions.drop(where, model_id)
            raise
        with tracing.span("deletion.publication"):
            _count(outcome, len(tasks))  # before the wake-up: seen done, seen counted
            ctx.announcer.announce()  # the long polls of these requests look again now
    method = method_for(inputs.spec.method.name, inputs.spec)
    keep_resident(sessions, where, batch, outcome, version_id, method)
    return outcome


def _hold_until(batch: Batch) -> None:
    """Constant-time publication: no commit before the batch's public deadline, so the time
    from a request to its certificate does not tell which branch ran. An update that ends
    past it is published at once, and counted (`lethe_publication_deadline_missed_total`,
    for admins: whether it missed depends on the branch)."""
    if batch.publish_at is None:
        return
    left = (batch.publish_at - utcnow()).total_seconds()
    if left < 0:
        DEADLINES_MISSED.inc()
        return
    shutdown.sleep(left)


def _commit(
    ctx: JobContext,
    batch: Batch,
    outcome: Outcome | None,
    stored: store.VersionBlobs | None,
) -> int | None:
    """The update's commit (the log's key read just before it); a lease lost before it
    leaves the stored blobs referenced by nothing, so they go at once."""
    try:
        with tracing.span("deletion.commit"):
            signer = signing_key(ctx.settings)
            return ctx.db.run(
                lambda session: commit.commit_update(session, ctx, batch, outcome, stored, signer),
                retry_integrity=True,
            )
    except LeaseLost:
        if stored is not None:
            ctx.blobs.discard(stored.both)
        raise


def _failed(ctx: JobContext, model_id: int, tasks: list[ClaimedTask], exc: Exception) -> bool:
    """A batch's one error policy, by what failed: the worker stopping puts its tasks back,
    unpenalised; the exact retrain diverging (`Unrecoverable`) withdraws the model; storage
    not answering puts them back after a back-off, unpenalised; anything else counts an
    attempt, and after the last withdraws the model and raises (RQ records the job failed).
    The data is erased whichever way the update goes."""
    db, settings, ids = ctx.db, ctx.settings, [t.task_id for t in tasks]
    if isinstance(exc, shutdown.Interrupted):  # the next start applies them
        db.run(lambda session: claim.release_tasks(session, ids))
        return False
    if isinstance(exc, Unrecoverable):  # retrying cannot help
        _withdraw(ctx, model_id, str(exc))
        ctx.announcer.announce()
        log.error("model %s withdrawn: %s", model_id, exc)
        compact_after_erasure(db, settings)
        return False
    if is_fault(exc):  # a full disk, an I/O error, a store outage: not the update's fault
        STORAGE_FAULTS.labels("process_deletions").inc()
        log.warning("model %s: %s; its deletions wait for storage", model_id, exc)
        wait, why = (settings.retry_backoff_seconds or [5])[0], fault_text(exc)
        db.run(lambda session: claim.release_tasks(session, ids, wait, why))
        return False
    final = _fail(ctx, tasks, exc)
    ctx.announcer.announce()
    log.exception("deletion batch for model %s failed (final=%s)", model_id, final)
    if final:  # the model was withdrawn and the data erased: compact, then let RQ see it
        compact_after_erasure(db, settings)
        raise exc
    return False


def _count(outcome: Outcome | None, tasks: int) -> None:
    """A committed batch in the worker's counters: its requests by method, a fallback."""
    method = outcome.decision.method if outcome is not None else "none"
    decision = outcome.decision if outcome is not None else None
    if isinstance(decision, Fallback):
        FALLBACKS.labels(decision.requested).inc()
    elif decision is not None and decision.branch:  # the retrain through the mechanism
        FALLBACKS.labels(decision.method).inc()
    DELETIONS_PROCESSED.labels(method).inc(tasks)


def _compute(
    ctx: JobContext, batch: Batch, inputs: UpdateInputs, device: torch.device
) -> tuple[Outcome | None, store.VersionBlobs | None]:
    """The update and its release's blobs, written while its metrics are measured (nothing
    when the batch removes nothing: no new version)."""
    if not batch.removed:
        return None, None
    here = tracing.current()  # the store runs on a thread of its own: carry the trace there

    def stored(release: Release) -> store.VersionBlobs:
        with tracing.attached(here), tracing.span("deletion.store"):
            return store.store_release(ctx.blobs, batch, release)

    inputs = replace(inputs, shards=shard_runner(ctx, batch.model_id))
    return compute_storing(inputs, device, stored, lambda done: ctx.blobs.discard(done.both))


def _withdraw(ctx: JobContext, model_id: int, reason: str) -> None:
    """Withdraw the model and erase its requests' data, if this worker still leases it."""

    def work(session: Session) -> None:
        claim.check_lease(session, model_id)
        commit.withdraw_model(session, ctx.blobs, model_id, reason)

    ctx.db.run(work)


def _fail(ctx: JobContext, tasks: list[ClaimedTask], exc: Exception) -> bool:
    settings = ctx.settings

    def work(session: Session) -> bool:
        return commit.fail_tasks(
            session,
            ctx.blobs,
            [t.task_id for t in tasks],
            f"{type(exc).__name__}: {exc}",
            settings.retry_backoff_seconds,
            settings.job_retries + 1,
        )

    return ctx.db.run(work)
