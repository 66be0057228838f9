"""Job entry points (RQ or the embedded worker): train_model and process_deletions.

Every job is load → compute → commit: one short read loads what the computation needs, the
computation runs with no transaction open, one write commits the result (DESIGN §6). The load
is on CPU; the computation runs on the worker's device (LETHE_DEVICE, workers/device.py) and
its results come back to CPU before they are committed.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
from safetensors.torch import load as st_load
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app import pause, shutdown
from app.db.session import Database, database
from app.db.tables import Dataset, DeletionTask, Model, task_is_due, utcnow
from app.dispatch import DELETE, TRAIN, due_key, take_signal
from app.jsontypes import JsonMap, JsonObject, json_object
from app.ledger.publish import publish_soon
from app.ledger.transparency import signing_key
from app.privacy.lineage import LineageBudget, history_after, prepare_next
from app.settings import Settings, get_settings
from app.specs import ImportedWeights
from app.states import ModelStatus, Stage, TaskStatus, VersionKind
from app.storage.blobs import blobs
from app.storage.erasure import compact_after_erasure
from app.storage.faults import fault_text, is_fault
from app.wakeups import Announcer, channel
from app.wire import Progress
from maths.nets import build_net
from maths.training import Diverged, ProgressFn, accuracy, check_converged
from methods.compute import ModelSpec, RetainedData, Trained, UpdateInputs, fit, method_for
from workers import pipeline
from workers.certify import lineage_fields
from workers.data import Arrays, database_key, test_arrays, training_arrays
from workers.device import arrays_to, trained_to_cpu, training_inputs_to, worker_device
from workers.lease import WORKER_ID, LeaseLost, ModelLease
from workers.metrics import (
    DELETIONS_PROCESSED,
    FALLBACKS,
    JOB_DURATION,
    SESSIONS_WARMED,
    STORAGE_FAULTS,
)
from workers.resident import ModelSession, Sessions
from workers.statistics import write_block
from workers.updates import ACCURACY_ROWS, compute_storing
from workers.values import Batch, ClaimedTask, Fallback, Outcome, TrainingInputs, Unrecoverable

log = logging.getLogger("lethe.jobs")


def _setup(settings: Settings) -> torch.device:
    """Threads, and the device the job computes on (DeviceUnavailable before any work is
    claimed when LETHE_DEVICE=cuda finds no GPU)."""
    if settings.torch_threads > 0:
        torch.set_num_threads(settings.torch_threads)
    return worker_device(settings)


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


def train_model(model_id: int) -> str:
    """Train version 1 of a queued model (with its method's recording), reporting progress."""
    take_signal(TRAIN, model_id)  # before reading: a later signal is not de-duplicated away
    settings = get_settings()
    db = database(settings.resolved_database_url)
    device = _setup(settings)
    started = time.perf_counter()
    with _lease(settings, model_id) as lease:
        if not lease.held:
            return "busy"
        if not _start_training(db, model_id):
            return "nothing to do"
        pause.point("training", model_id)
        stored: pipeline.VersionBlobs | None = None
        version_id: int | None = None
        try:
            with db.read() as session:
                keeps = resident_sessions(settings).capacity > 0
                inputs = _load_training(session, model_id, hand_over=keeps)
            trained, metrics = _train(inputs, _progress_writer(db, model_id), device)
            rows = arrays_to(inputs.data, device)  # the session's rows, where it computes
            prepared = _prepare_resident(settings, db, model_id, inputs, rows, trained)
            kind = VersionKind.imported if inputs.imported else VersionKind.trained
            stored = pipeline.store_version_blobs(
                db, model_id, 1, None, kind, trained.state, trained.next_state
            )
            version_id = db.run(
                lambda session: _commit_trained(session, model_id, inputs, trained, stored, metrics)
            )
            _seed_session(settings, db, model_id, version_id, inputs, rows, prepared, device)
        except BaseException as exc:
            if stored is not None and version_id is None:  # written, never to be recorded
                blobs().discard(stored.both)  # (issue 53: a 4 MB orphan until the sweep)
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
    settings: Settings,
    db: Database,
    model_id: int,
    inputs: TrainingInputs,
    rows: Arrays,
    trained: Trained,
) -> _Prepared | None:
    """The method's resident state (convex_head's anchored float64 Hessians: a pass over the
    rows), computed before the version commits, so a model is `ready` only once its first
    deletion can run warm (issue 28: at a million rows the first deletion waited 40 s for it
    after `ready`). It is made on the device of `rows`, the worker's, where the updates that
    use it compute (made on the CPU, a GPU worker's first update failed on it and retrained).
    None when this worker keeps no sessions."""
    if resident_sessions(settings).capacity <= 0:
        return None
    with db.write(durable=False) as session:
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
    settings: Settings,
    db: Database,
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
        # so the first update does not read it again (at a million rows that was 4 s)
        first = replace(first, history=(), test_left=inputs.test_left)
        if prepared.method_state is not None:
            first = replace(first, method_state=prepared.method_state)
        resident_sessions(settings).put(database_key(db.engine), first)
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


def _load_training(session: Session, model_id: int, hand_over: bool) -> TrainingInputs:
    """`hand_over`: the training rows go to the model's first resident session, so the
    opened-samples cache does not keep a second copy of them."""
    model = session.get(Model, model_id)
    assert model is not None, "the caller holds the model's lease"
    dataset = session.get(Dataset, model.dataset_id)
    assert dataset is not None, "a model's dataset is never deleted"
    imported = model.training.imported
    test_left = pipeline.test_rows_left(session, dataset.id)  # before the split it dates
    return TrainingInputs(
        spec=pipeline.model_spec(model, dataset),
        data=training_arrays(session, model_id, dataset, hand_over=hand_over),
        test=test_arrays(session, dataset),
        test_left=test_left,
        imported=imported,
        imported_bytes=blobs().read(session, imported.blob) if imported else None,
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
    model_id: int,
    inputs: TrainingInputs,
    trained: Trained,
    stored: pipeline.VersionBlobs,
    metrics: JsonObject,
) -> int:
    """Record version 1 (its blobs are `stored`) and make the model ready; returns its id."""
    model = pipeline.check_lease(session, model_id)
    if trained.record:
        metrics = {**metrics, "record": json_object(trained.record)}
    if inputs.imported is not None:
        blobs().retire(session, [inputs.imported.blob])
    version = pipeline.write_version(
        session,
        model_id,
        number=1,
        parent_id=None,
        kind=VersionKind.imported if inputs.imported else VersionKind.trained,
        stored=stored,
        metrics=metrics,
    )
    if trained.statistics is not None:
        write_block(session, model_id, trained.statistics, replace=True)
    epochs = inputs.spec.training.epochs
    model.current_version_id, model.status, model.error = version.id, ModelStatus.ready, None
    model.progress = Progress(stage=Stage.ready, epoch=epochs, epochs=epochs)
    return version.id


# ---- deletions ------------------------------------------------------------------------------


_SESSIONS: Sessions | None = None
_ANNOUNCER: Announcer | None = None


def resident_sessions(settings: Settings) -> Sessions:
    """This process's resident model sessions (made on first use, sized by the settings)."""
    global _SESSIONS
    if _SESSIONS is None or _SESSIONS.capacity != settings.resident_models:
        _SESSIONS = Sessions(settings.resident_models)
    return _SESSIONS


def announcer(settings: Settings) -> Announcer:
    """This process's announcer of finished requests (app/wakeups.py)."""
    global _ANNOUNCER
    if _ANNOUNCER is None or _ANNOUNCER.channel != channel(settings.queue_name):
        _ANNOUNCER = Announcer(settings.redis_url, settings.queue_name)
    return _ANNOUNCER


def warm_model(model_id: int) -> str:
    """The model's resident session made ahead of its next update (a worker that replaced
    one which gave way after an erasure warms what that one held: workers/recycle.py)."""
    settings = get_settings()
    db = database(settings.resolved_database_url)
    try:
        made = pipeline.warm_session(db, model_id, resident_sessions(settings), _setup(settings))
    except Exception:  # a cache: the next update reads cold, as it would have
        log.warning("model %s: could not warm its session", model_id, exc_info=True)
        return "not warmed"
    if made:
        SESSIONS_WARMED.inc()
    return "warmed" if made else "nothing to warm"


def process_deletions(model_id: int) -> str:
    """Apply every due deletion task of the model, coalesced, one update per batch."""
    take_signal(DELETE, model_id)  # before reading: a request committed from now on re-signals
    settings = get_settings()
    _forget_due(settings, model_id)  # the claim below covers every push made before it
    db = database(settings.resolved_database_url)
    device = _setup(settings)
    applied = 0

    def first_batch(session: Session, lease: ModelLease) -> list[ClaimedTask]:
        return _claim_in(session, settings, model_id, lease)

    while True:
        with _lease(settings, model_id, first_batch) as lease:
            if not lease.held:
                return f"busy (applied {applied})"
            lingered = False
            # the batch claimed in the lease's own transaction, then claims of their own
            first: list[ClaimedTask] | None = cast(list[ClaimedTask], lease.taken)
            while True:
                claimed = False
                while True:
                    _forget_due(settings, model_id)  # the claim covers every push before it
                    if not (tasks := _next_batch(db, settings, model_id, lease, first)):
                        break
                    first = None
                    claimed = True
                    if not _run_batch(db, settings, model_id, tasks, device):
                        return f"applied {applied}; a batch failed and will be retried"
                    applied += len(tasks)
                    if _lingers(settings) and len(tasks) < settings.max_batch_requests:
                        break  # it claimed all that was due; its wait wakes on a push since
                    if not _has_due(db, model_id):  # a read, not an empty claim's write
                        break
                first = None
                # due work this worker cannot claim (the model is not ready): stop lingering
                if (lingered and not claimed) or not _linger(db, settings, model_id):
                    break
                lingered = True
        # Re-check after releasing: a request committed while we held the lease may have had
        # its signal dropped by a worker that saw the model busy.
        if not _has_due(db, model_id):
            return f"applied {applied}"


STICKY_POLL_SECONDS = 0.1  # the fallback look when no wake-up comes through Redis


def _linger(db: Database, settings: Settings, model_id: int) -> bool:
    """Distributed: keep the lease for `sticky_seconds` after a model's last batch, watching
    for its next due task (True when one came). Another worker signalled meanwhile finds the
    model busy, so the next update runs here, on the warm session (issue 28). The API pushes
    to the model's due list after committing a deletion (`dispatch.due_key`; a push waits
    there for 5 s): the worker blocks on it and, when woken, goes straight to its claim; it
    looks at the database itself every STICKY_POLL_SECONDS, for a push lost with Redis (a
    20 ms sleep between looks cost a deletion 10 ms on average; a look before and after each
    wait, 2–3 ms). The caller has just looked. The lease stays the truth: if this worker
    dies, the lease expires and any worker takes over."""
    if not _lingers(settings):
        return False
    deadline = time.monotonic() + settings.sticky_seconds
    key = due_key(settings.queue_name, model_id)
    while (left := deadline - time.monotonic()) > 0:
        shutdown.check()
        if _wait_for_due(settings, key, min(left, STICKY_POLL_SECONDS)):
            return True
        if _has_due(db, model_id):
            return True
    return False


def _lingers(settings: Settings) -> bool:
    """Whether this worker keeps a model's lease after its last batch (`_linger`)."""
    return not settings.embedded and settings.sticky_seconds > 0


_DUE_REDIS: dict[str, Any] = {}  # redis URL -> this process's connection for due lists


def _due_redis(settings: Settings) -> Any:
    from redis import Redis

    url = str(settings.redis_url)
    redis = _DUE_REDIS.get(url)
    if redis is None:
        redis = _DUE_REDIS[url] = Redis.from_url(url, socket_timeout=5)
    return redis


def _forget_due(settings: Settings, model_id: int) -> None:
    """Before a claim, empty the model's due list: the claim covers every push made before it,
    so a push left there would wake the lingering worker for tasks already applied (and end
    its linger on an empty claim)."""
    if not _lingers(settings):
        return
    try:
        _due_redis(settings).delete(due_key(settings.queue_name, model_id))
    except Exception:  # noqa: BLE001 - Redis away: a stale push costs one empty claim
        log.debug("could not empty the due list of model %s", model_id, exc_info=True)


def _wait_for_due(settings: Settings, key: str, timeout: float) -> bool:
    """Until the API pushes to `key` (True) or `timeout` passes; a sleep when Redis is away
    (the database is the record: a lost wake-up costs one fallback look). The pushes left
    behind are emptied by `_forget_due` just before the claim that covers them."""
    try:
        return _due_redis(settings).blpop([key], timeout=timeout) is not None
    except Exception:  # noqa: BLE001 - Redis away: poll the database instead
        log.debug("could not wait on %s", key, exc_info=True)
        time.sleep(timeout)
        return False


def _next_batch(
    db: Database,
    settings: Settings,
    model_id: int,
    lease: ModelLease,
    first: list[ClaimedTask] | None,
) -> list[ClaimedTask]:
    """The batch claimed with the lease (`first`, possibly empty), else a new claim."""
    return first if first is not None else _claim(db, settings, model_id, lease)


def _claim(db: Database, settings: Settings, model_id: int, lease: ModelLease) -> list[ClaimedTask]:
    # one statement on PostgreSQL; a claim lost in a crash expires with the lease
    with db.single(durable=False) as session:
        return _claim_in(session, settings, model_id, lease)


def _claim_in(
    session: Session, settings: Settings, model_id: int, lease: ModelLease
) -> list[ClaimedTask]:
    """Claim the model's next batch in the caller's transaction (none unless it is ready)."""
    return pipeline.claim_tasks(session, model_id, settings.max_batch_requests, lease.deadline())


def _has_due(db: Database, model_id: int) -> bool:
    """Whether a queued task of the model is due now (not waiting out a retry backoff)."""
    now = utcnow()
    with db.read() as session:
        return (
            session.scalar(
                select(DeletionTask.id)
                .where(
                    DeletionTask.model_id == model_id,
                    DeletionTask.status == TaskStatus.queued,
                    task_is_due(now),
                )
                .limit(1)
            )
            is not None
        )


def _run_batch(
    db: Database,
    settings: Settings,
    model_id: int,
    tasks: list[ClaimedTask],
    device: torch.device,
) -> bool:
    """Load, compute, commit one batch. Returns False when it failed and was put back (or
    failed for good: then the exception propagates, so RQ records the job as failed)."""
    started = time.perf_counter()
    sessions, where = resident_sessions(settings), database_key(db.engine)
    try:
        try:
            with db.read() as session:  # one short read; no transaction while computing
                batch, inputs = pipeline.load_batch(session, model_id, tasks, sessions, device)
            outcome, stored = _compute(batch, inputs, device)  # no transaction open
            pause.point("before-commit", model_id)  # (a crash here leaves orphans: swept)
            signer = signing_key(settings)
            try:
                version_id = db.run(
                    lambda session: pipeline.commit_update(session, batch, outcome, stored, signer),
                    retry_integrity=True,
                )
            except LeaseLost:  # refused before its commit: nothing references them
                if stored is not None:
                    blobs().discard(stored.both)
                raise
        except BaseException:
            sessions.drop(where, model_id)  # it may no longer be at the current version
            raise
        announcer(settings).announce()  # the long polls of these requests look again now
        _keep_resident(sessions, where, batch, outcome, version_id)
    except shutdown.Interrupted:  # back to queued, unpenalised: the next start applies them
        ids = [t.task_id for t in tasks]
        db.run(lambda session: pipeline.release_tasks(session, ids))
        return False
    except Unrecoverable as exc:  # the retrain itself diverged: retrying cannot help
        _withdraw(db, model_id, str(exc))
        announcer(settings).announce()
        log.error("model %s withdrawn: %s", model_id, exc)
        compact_after_erasure(db)
        return False
    except Exception as exc:
        if is_fault(exc):  # a full disk, an I/O error, a store outage: not the update's
            # fault, so unpenalised and retried with back-off (issue 53: ENOSPC withdrew)
            STORAGE_FAULTS.labels("process_deletions").inc()
            log.warning("model %s: %s; its deletions wait for storage", model_id, exc)
            ids, wait = [t.task_id for t in tasks], (settings.retry_backoff_seconds or [5])[0]
            why = fault_text(exc)
            db.run(lambda session: pipeline.release_tasks(session, ids, wait, why))
            return False
        final = _fail(db, settings, tasks, exc)
        announcer(settings).announce()
        log.exception("deletion batch for model %s failed (final=%s)", model_id, final)
        if final:  # the model was withdrawn and the data erased: compact, then let RQ see it
            compact_after_erasure(db)
            raise
        return False
    compacting = time.perf_counter()
    compact_after_erasure(db)  # destroyed keys (samples, purged versions) leave the files
    if outcome is not None:  # new certificates: a checkpoint for the witnesses to cosign
        publish_soon(db, settings)
    JOB_DURATION.labels("erasure_compaction").observe(time.perf_counter() - compacting)
    method = outcome.decision.method if outcome is not None else "none"
    decision = outcome.decision if outcome is not None else None
    if isinstance(decision, Fallback):
        FALLBACKS.labels(decision.requested).inc()
    elif decision is not None and decision.branch:  # the retrain through the mechanism
        FALLBACKS.labels(decision.method).inc()
    DELETIONS_PROCESSED.labels(method).inc(len(tasks))
    JOB_DURATION.labels("process_deletions").observe(time.perf_counter() - started)
    return True


def _compute(
    batch: Batch, inputs: UpdateInputs, device: torch.device
) -> tuple[Outcome | None, pipeline.VersionBlobs | None]:
    """The update and its release's blobs, written while its metrics are measured (nothing
    when the batch removes nothing: no new version)."""
    if not batch.removed:
        return None, None
    return compute_storing(
        inputs,
        device,
        lambda release: pipeline.store_release(batch, release),
        lambda stored: blobs().discard(stored.both),
    )


def _keep_resident(
    sessions: Sessions,
    where: str,
    batch: Batch,
    outcome: Outcome | None,
    version_id: int | None,
) -> None:
    """Move the batch's session to the version just committed, its removed rows gone (their
    plaintext leaves this worker's memory with the commit); unchanged when nothing was
    removed (no new version)."""
    if batch.session is None:
        return
    if outcome is None or version_id is None:
        sessions.put(where, batch.session)
        return
    release = outcome.decision.release
    state = {k: v.detach().cpu() for k, v in release.next_state.items()}
    before = batch.session.history
    history = (
        tuple(history_after(before, lineage_fields(outcome.decision)))
        if before is not None
        else None
    )
    kept = batch.session.record
    record = kept.after(batch.removed, _as_stored(release.record)) if kept is not None else None
    sessions.put(
        where,
        batch.session.advance(version_id, batch.removed, state, release.resident, history, record),
    )
    if history and release.event is not None:  # the next noisy release's ε, solved now
        try:
            policy = batch.policy
            prepare_next(LineageBudget(policy.lineage_epsilon, policy.lineage_delta), history)
        except Exception:  # noqa: BLE001 - only a head start: the admission solves it anyway
            log.debug("could not prepare the next admission of model %s", batch.model_id)


def _as_stored(record: JsonMap | None) -> JsonMap | None:
    """A release's training record as a read of its version's metrics gives it back."""
    return json.loads(json.dumps(json_object(record))) if record else None


def _withdraw(db: Database, model_id: int, reason: str) -> None:
    """Withdraw the model and erase its requests' data, if this worker still leases it."""

    def work(session: Session) -> None:
        pipeline.check_lease(session, model_id)
        pipeline.withdraw_model(session, model_id, reason)

    db.run(work)


def _fail(db: Database, settings: Settings, tasks: list[ClaimedTask], exc: Exception) -> bool:
    def work(session: Session) -> bool:
        return pipeline.fail_tasks(
            session,
            [t.task_id for t in tasks],
            f"{type(exc).__name__}: {exc}",
            settings.retry_backoff_seconds,
            settings.job_retries + 1,
        )

    return db.run(work)
