"""Job entry points (RQ or the embedded worker): train_model, process_deletions, warm_model;
each takes the worker's JobContext (workers/context.py) first.

An update is claim → load → compute → store → commit → publish, a module each
(workers/claim.py, load.py, updates.py, store.py, commit.py, app/core/ledger/publish.py): one short
read loads what the computation needs, the computation runs with no transaction open, one
write commits the result (DESIGN §6). The load is on CPU; the computation runs on the worker's
device (LETHE_DEVICE, workers/device.py) and its results come back to CPU before the commit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

import torch
from safetensors.torch import load as st_load
from sqlalchemy import update
from sqlalchemy.orm import Session

from app.core import pause, shutdown, tracing
from app.core.db.session import Database
from app.core.db.tables import Dataset, Model
from app.core.dispatch import DELETE, TRAIN, take_signal
from app.core.jsontypes import JsonObject, json_object
from app.core.ledger.transparency import signing_key
from app.core.settings import Settings
from app.core.specs import ImportedWeights
from app.core.states import ModelStatus, Stage, VersionKind
from app.core.storage.erasure import compact_after_erasure
from app.core.storage.faults import fault_text, is_fault
from app.core.webhooks import events
from app.core.wire import Progress
from maths.nets import build_net
from maths.training import Diverged, ProgressFn, accuracy, check_converged
from methods.compute import (
    ModelSpec,
    Release,
    RetainedData,
    Trained,
    UpdateInputs,
    fit,
    method_for,
)
from workers import claim, commit, learning, load, store, traces
from workers.advance import keep_resident
from workers.context import JobContext
from workers.data import Arrays, database_key, test_arrays, training_arrays
from workers.device import arrays_to, trained_to_cpu, training_inputs_to
from workers.lease import WORKER_ID, LeaseLost, ModelLease
from workers.linger import Linger
from workers.metrics import (
    DELETIONS_PROCESSED,
    FALLBACKS,
    JOB_DURATION,
    SESSIONS_WARMED,
    STORAGE_FAULTS,
)
from workers.resident import ModelSession
from workers.statistics import write_block
from workers.updates import ACCURACY_ROWS, compute_storing
from workers.values import Batch, ClaimedTask, Fallback, Outcome, TrainingInputs, Unrecoverable

log = logging.getLogger("lethe.jobs")


def _lease(
    settings: Settings,
    model_id: int,
    on_take: Callable[[Session, ModelLease], object] | None = None,
) -> ModelLease:
    return ModelLease(
        settings.resolved_database_url,
        model_id,
        settings.lease_seconds,
        settings.heartbeat_seconds,
        "embedded" if settings.embedded else "rq",
        on_take,
    )


# ---- training -------------------------------------------------------------------------------


def train_model(ctx: JobContext, model_id: int) -> str:
    """Train version 1 of a queued model (with its method's recording), reporting progress."""
    take_signal(TRAIN, model_id)  # before reading: a later signal is not de-duplicated away
    settings, db = ctx.settings, ctx.db
    device = ctx.device()
    started = time.perf_counter()
    with _lease(settings, model_id) as lease:
        if not lease.held:
            return "busy"
        if not _start_training(db, model_id):
            return "nothing to do"
        pause.point(settings, "training", model_id)
        stored: store.VersionBlobs | None = None
        version_id: int | None = None
        try:
            with db.read() as session:
                keeps = ctx.resident_sessions().capacity > 0
                inputs = _load_training(session, ctx, model_id, hand_over=keeps)
            trained, metrics = _train(inputs, _progress_writer(db, model_id), device)
            rows = arrays_to(inputs.data, device)  # the session's rows, where it computes
            prepared = _prepare_resident(ctx, model_id, inputs, rows, trained)
            kind = VersionKind.imported if inputs.imported else VersionKind.trained
            stored = store.store_version_blobs(
                db, ctx.blobs, model_id, 1, None, kind, trained.state, trained.next_state
            )
            version_id = db.run(
                lambda session: _commit_trained(
                    session, ctx, model_id, inputs, trained, stored, metrics
                )
            )
            _seed_session(ctx, model_id, version_id, inputs, rows, prepared, device)
        except BaseException as exc:
            if stored is not None and version_id is None:  # written, never to be recorded
                ctx.blobs.discard(stored.both)  # (a 4 MB orphan until the sweep)
            if isinstance(exc, LeaseLost) or not isinstance(exc, Exception):
                raise
            if not isinstance(exc, shutdown.Interrupted) and not is_fault(exc):
                _training_failed(db, model_id, exc)
                raise
            if is_fault(exc):  # back to the queue: trained again once storage answers
                STORAGE_FAULTS.labels("train_model").inc()
                log.warning("model %s: %s; training goes back to the queue", model_id, exc)
            with db.write() as session:
                session.execute(
                    update(Model)
                    .where(Model.id == model_id, Model.lease_owner == WORKER_ID)
                    .values(status=ModelStatus.queued, progress=Progress(stage=Stage.queued))
                )
            return "interrupted"
    JOB_DURATION.labels("train_model").observe(time.perf_counter() - started)
    return "trained"


@dataclass(frozen=True)
class _Prepared:
    """What the first resident session starts from: the noise-free state on CPU and the
    method's resident state (None when `prepare` failed: the first update prepares it)."""

    state: dict[str, torch.Tensor]
    method_state: object | None


def _training_failed(db: Database, model_id: int, exc: Exception) -> None:
    """The model is `failed`, with the error, under this worker's lease."""
    with db.write() as session:
        session.execute(
            update(Model)
            .where(Model.id == model_id, Model.lease_owner == WORKER_ID)
            .values(
                status=ModelStatus.failed,
                error=f"training failed: {exc}",
                progress=Progress(stage=Stage.failed),
            )
        )


def _prepare_resident(
    ctx: JobContext,
    model_id: int,
    inputs: TrainingInputs,
    rows: Arrays,
    trained: Trained,
) -> _Prepared | None:
    """The method's resident state (convex_head's anchored float64 Hessians: a pass over the
    rows), computed before the version commits, so a model is `ready` only once its first
    deletion can run warm (else the first deletion waited for it after `ready`). It is made on
    the device of `rows`, the worker's, where the updates that use it compute (made on the CPU, a
    GPU worker's first update failed on it and retrained).
    None when this worker keeps no sessions."""
    if ctx.resident_sessions().capacity <= 0:
        return None
    with ctx.db.write(durable=False) as session:
        session.execute(
            update(Model)
            .where(Model.id == model_id, Model.lease_owner == WORKER_ID)
            .values(progress=Progress(stage=Stage.preparing))
        )
    state = {k: v.detach().cpu() for k, v in trained.next_state.items()}
    data = RetainedData(rows.sample_ids, rows.X, rows.y)
    on_device = {k: v.to(rows.X.device) for k, v in state.items()}
    try:
        prepared = method_for(inputs.spec.method.name, inputs.spec).prepare(data, on_device)
    except Exception:  # not the version's fault: the first update prepares it again
        log.warning("model %s: could not prepare its resident state", model_id, exc_info=True)
        prepared = None
    return _Prepared(state, prepared)


def _seed_session(
    ctx: JobContext,
    model_id: int,
    version_id: int,
    inputs: TrainingInputs,
    rows: Arrays,
    prepared: _Prepared | None,
    device: torch.device,
) -> None:
    """Keep what training read as the model's first resident session, its rows on the
    worker's device (the version is committed: a failure here only costs the first update a
    cold read)."""
    if prepared is None:
        return
    try:
        first = ModelSession.of(model_id, version_id, rows, prepared.state, inputs.test, device)
        # a trained version has released no noise yet; the split is dated by training's read,
        # so the first update does not read it again
        first = replace(first, history=(), test_left=inputs.test_left)
        if prepared.method_state is not None:
            first = replace(first, method_state=prepared.method_state)
        ctx.resident_sessions().put(database_key(ctx.db.engine), first)
    except Exception:
        log.warning("model %s: no resident session after training", model_id, exc_info=True)


def _start_training(db: Database, model_id: int) -> bool:
    with db.write() as session:
        model = session.get(Model, model_id)
        if model is None or model.status not in (ModelStatus.queued, ModelStatus.training):
            return False
        model.status = ModelStatus.training
        model.progress = Progress(stage=Stage.loading)
        return True


def _load_training(
    session: Session, ctx: JobContext, model_id: int, hand_over: bool
) -> TrainingInputs:
    """`hand_over`: the training rows go to the model's first resident session, so the
    opened-samples cache does not keep a second copy of them."""
    model = session.get(Model, model_id)
    assert model is not None, "the caller holds the model's lease"
    dataset = session.get(Dataset, model.dataset_id)
    assert dataset is not None, "a model's dataset is never deleted"
    imported = model.training.imported
    test_left = load.test_rows_left(session, dataset.id)  # before the split it dates
    return TrainingInputs(
        spec=load.model_spec(model, dataset),
        data=training_arrays(session, ctx.opened, model_id, dataset, hand_over=hand_over),
        test=test_arrays(session, ctx.opened, dataset),
        test_left=test_left,
        imported=imported,
        imported_bytes=ctx.blobs.read(session, imported.blob) if imported else None,
        dataset_id=dataset.id,
    )


def _train(
    inputs: TrainingInputs, progress: ProgressFn, device: torch.device
) -> tuple[Trained, JsonObject]:
    """Train on `device`; the state and statistics come back on CPU."""
    inputs = training_inputs_to(inputs, device)
    spec, data, test = inputs.spec, inputs.data, inputs.test
    if inputs.imported is not None:
        trained = _load_imported(spec, inputs.imported, inputs.imported_bytes)
    else:
        retained = RetainedData(data.sample_ids, data.X, data.y, data.subjects, data.external_ids)
        trained = fit(spec, retained, progress)
        try:
            check_converged(
                spec.architecture, trained.state, data.X, data.y, spec.n_classes, spec.aggregation
            )
        except Diverged as exc:
            raise Diverged(
                f"training diverged: {exc}; nothing was released. Lower the learning rate or "
                "the weight decay, or train for fewer epochs"
            ) from exc
    metrics = {
        **trained.metrics,
        "n_train": len(data),
        "n_test": len(test),
        "train_accuracy": accuracy(
            spec.architecture, trained.state, data.X, data.y, spec.n_classes, spec.aggregation
        ),
        # on the rows an update's metric uses (updates.ACCURACY_ROWS), so versions compare
        "test_accuracy": accuracy(
            spec.architecture,
            trained.state,
            test.X[:ACCURACY_ROWS],
            test.y[:ACCURACY_ROWS],
            spec.n_classes,
            spec.aggregation,
        ),
        "test_accuracy_rows": min(len(test.y), ACCURACY_ROWS),
    }
    return trained_to_cpu(trained), metrics


def _load_imported(
    spec: ModelSpec, imported: ImportedWeights, data: bytes | bytearray | None
) -> Trained:
    """Weights trained elsewhere, loaded without pickle and checked against the spec."""
    if data is None:
        raise LookupError("the imported weights are missing")
    tensors = {k: v.float().contiguous() for k, v in st_load(bytes(data)).items()}
    net = build_net(spec.architecture, spec.n_features, spec.n_classes)
    net.load_state_dict(tensors, strict=True)
    if not all(torch.isfinite(v).all() for v in tensors.values()):
        raise ValueError("the imported weights contain NaN or infinite values")
    return Trained(
        state=tensors,
        statistics=None,
        record={},
        metrics={"imported": True, "imported_sha256": imported.sha256},
    )


def _progress_writer(db: Database, model_id: int) -> ProgressFn:
    """Record 'epoch k of E' at most twice a second (and at the last epoch)."""
    last = [0.0]

    def progress(epoch: int, epochs: int, loss: float) -> None:
        now = time.perf_counter()
        if epoch < epochs and now - last[0] < 0.5:
            return
        last[0] = now
        with db.write() as session:
            session.execute(
                update(Model)
                .where(Model.id == model_id)
                .values(
                    progress=Progress(
                        stage=Stage.training,
                        epoch=epoch,
                        epochs=epochs,
                        # JSON has no NaN (PostgreSQL refuses it): a diverged loss is null
                        loss=round(loss, 6) if math.isfinite(loss) else None,
                    )
                )
            )

    return progress


def _commit_trained(
    session: Session,
    ctx: JobContext,
    model_id: int,
    inputs: TrainingInputs,
    trained: Trained,
    stored: store.VersionBlobs,
    metrics: JsonObject,
) -> int:
    """Record version 1 (its blobs are `stored`) and make the model ready; returns its id."""
    model = claim.check_lease(session, model_id)
    if trained.record:
        metrics = {**metrics, "record": json_object(trained.record)}
    if inputs.imported is not None:
        ctx.blobs.retire(session, [inputs.imported.blob])
    version = commit.write_version(
        session,
        ctx.blobs,
        model_id,
        number=1,
        parent_id=None,
        kind=VersionKind.imported if inputs.imported else VersionKind.trained,
        stored=stored,
        metrics=metrics,
    )
    events.version_published(
        session,
        model_id,
        1,
        VersionKind.imported if inputs.imported else VersionKind.trained,
        version.weights_sha256,
        [],
    )
    if trained.statistics is not None:
        write_block(session, ctx.keyring, model_id, trained.statistics, replace=True)
    epochs = inputs.spec.training.epochs
    model.current_version_id, model.status, model.error = version.id, ModelStatus.ready, None
    model.progress = Progress(stage=Stage.ready, epoch=epochs, epochs=epochs)
    return version.id


# ---- deletions ------------------------------------------------------------------------------


def warm_model(ctx: JobContext, model_id: int) -> str:
    """The model's resident session made ahead of its next update (a worker that replaced
    one which gave way after an erasure warms what that one held: workers/recycle.py)."""
    try:
        made = load.warm_session(ctx, model_id, ctx.device())
    except Exception:  # a cache: the next update reads cold, as it would have
        log.warning("model %s: could not warm its session", model_id, exc_info=True)
        return "not warmed"
    if made:
        SESSIONS_WARMED.inc()
    return "warmed" if made else "nothing to warm"


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
        with _lease(ctx.settings, model_id, work.claim_in) as lease:
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
    started, db, settings = time.perf_counter(), ctx.db, ctx.settings
    sessions, where = ctx.resident_sessions(), database_key(db.engine)
    try:
        traced = traces.of_requests(
            db, tasks
        )  # nothing read when not tracing (app/core/tracing.py)
        with tracing.batch_trace(traced, {"lethe.model_id": model_id}):
            try:
                with tracing.span("deletion.load"), db.read() as session:  # no transaction
                    batch, inputs = load.load_batch(session, ctx, model_id, tasks, device)
                with tracing.span("deletion.compute"):  # while computing: none open
                    outcome, stored = _compute(ctx, batch, inputs, device)
                pause.point(settings, "before-commit", model_id)  # (a crash: orphans, swept)
                try:
                    with tracing.span("deletion.commit"):  # the log entry's key read, then it
                        signer = signing_key(settings)
                        version_id = db.run(
                            lambda session: commit.commit_update(
                                session, ctx, batch, outcome, stored, signer
                            ),
                            retry_integrity=True,
                        )
                except LeaseLost:  # refused before its commit: nothing references them
                    if stored is not None:
                        ctx.blobs.discard(stored.both)
                    raise
            except BaseException:
                sessions.drop(where, model_id)  # it may no longer be at the current version
                raise
            with tracing.span("deletion.publication"):
                _count(outcome, len(tasks))  # before the wake-up: seen done, seen counted
                ctx.announcer.announce()  # the long polls of these requests look again now
        keep_resident(sessions, where, batch, outcome, version_id)
    except shutdown.Interrupted:  # back to queued, unpenalised: the next start applies them
        ids = [t.task_id for t in tasks]
        db.run(lambda session: claim.release_tasks(session, ids))
        return False
    except Unrecoverable as exc:  # the retrain itself diverged: retrying cannot help
        _withdraw(ctx, model_id, str(exc))
        ctx.announcer.announce()
        log.error("model %s withdrawn: %s", model_id, exc)
        compact_after_erasure(db, settings)
        return False
    except Exception as exc:
        if is_fault(exc):  # a full disk, an I/O error, a store outage: not the update's
            # fault, so unpenalised and retried with back-off (ENOSPC withdrew)
            STORAGE_FAULTS.labels("process_deletions").inc()
            log.warning("model %s: %s; its deletions wait for storage", model_id, exc)
            ids, wait = [t.task_id for t in tasks], (settings.retry_backoff_seconds or [5])[0]
            why = fault_text(exc)
            db.run(lambda session: claim.release_tasks(session, ids, wait, why))
            return False
        final = _fail(ctx, tasks, exc)
        ctx.announcer.announce()
        log.exception("deletion batch for model %s failed (final=%s)", model_id, final)
        if final:  # the model was withdrawn and the data erased: compact, then let RQ see it
            compact_after_erasure(db, settings)
            raise
        return False
    compacting = time.perf_counter()
    compact_after_erasure(db, settings)  # destroyed keys (samples, purged versions) go
    if outcome is not None:  # new certificates: a checkpoint for the witnesses to cosign
        ctx.runtime.publisher.soon()
    JOB_DURATION.labels("erasure_compaction").observe(time.perf_counter() - compacting)
    JOB_DURATION.labels("process_deletions").observe(time.perf_counter() - started)
    return True


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
