"""The training job: version 1 of a queued model, trained on its dataset's training rows with
its method's recording, checked, stored and published with its progress on the way
(docs/architecture.md); and the warming of a model's resident session ahead of an update."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace

import torch
from safetensors.torch import load as st_load
from sqlalchemy import update
from sqlalchemy.orm import Session

from app.core import pause, shutdown
from app.core.db.session import Database
from app.core.db.tables import Dataset, Model
from app.core.dispatch import TRAIN, take_signal
from app.core.jsontypes import JsonObject, json_object
from app.core.specs import ImportedWeights
from app.core.states import ModelStatus, Stage, VersionKind
from app.core.storage.faults import is_fault
from app.core.webhooks import events
from app.core.wire import Progress
from maths.nets import build_net, weights_norm
from maths.training import Diverged, ProgressFn, accuracy, check_converged
from methods.compute import (
    ModelSpec,
    RetainedData,
    Trained,
    fit,
    method_for,
    same_device,
)
from methods.shards import ShardRunner
from workers import claim, commit, load, store
from workers.context import JobContext
from workers.data import Arrays, database_key, test_arrays, training_arrays
from workers.device import arrays_to, trained_to_cpu, training_inputs_to
from workers.lease import WORKER_ID, LeaseLost, lease_for
from workers.metrics import (
    JOB_DURATION,
    SESSIONS_WARMED,
    STORAGE_FAULTS,
)
from workers.resident import ModelSession
from workers.shards import shard_runner
from workers.statistics import write_block
from workers.updates import ACCURACY_ROWS
from workers.values import TrainingInputs

log = logging.getLogger("lethe.jobs")


def train_model(ctx: JobContext, model_id: int) -> str:
    """Train version 1 of a queued model (with its method's recording), reporting progress."""
    take_signal(TRAIN, model_id)  # before reading: a later signal is not de-duplicated away
    settings, db = ctx.settings, ctx.db
    device = ctx.device()
    started = time.perf_counter()
    with lease_for(settings, model_id) as lease:
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
            trained, metrics = _train(
                inputs, _progress_writer(db, model_id), device, shard_runner(ctx, model_id)
            )
            rows = arrays_to(inputs.data, device)  # the session's rows, where it computes
            prepared = _prepare_resident(ctx, model_id, inputs, rows, trained, device)
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
            _back_to_queue(db, model_id, exc)
            return "interrupted"
    JOB_DURATION.labels("train_model").observe(time.perf_counter() - started)
    return "trained"


def _back_to_queue(db: Database, model_id: int, exc: Exception) -> None:
    """An interrupted training (a stop, or storage that did not answer) is queued again."""
    if is_fault(exc):  # trained again once storage answers
        STORAGE_FAULTS.labels("train_model").inc()
        log.warning("model %s: %s; training goes back to the queue", model_id, exc)
    with db.write() as session:
        session.execute(
            update(Model)
            .where(Model.id == model_id, Model.lease_owner == WORKER_ID)
            .values(status=ModelStatus.queued, progress=Progress(stage=Stage.queued))
        )


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
    trained_on: torch.device,
) -> _Prepared | None:
    """The method's resident state (convex_head's anchored float64 Hessians, made while
    solving; else `prepare`, a pass over the rows), in place before the version commits,
    so a model is `ready` only once its first
    deletion can run warm (else the first deletion waited for it after `ready`). It is made on
    the device of `rows`, the worker's, where the updates that use it compute (made on the CPU, a
    GPU worker's first update failed on it and retrained).
    The state training made is used only where it was made on the rows' device
    (`trained_on`). None when this worker keeps no sessions."""
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
        made_here = same_device(trained_on, rows.X.device)
        prepared = trained.resident if made_here else None  # made while solving
        if prepared is None:
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
    inputs: TrainingInputs,
    progress: ProgressFn,
    device: torch.device,
    shards: ShardRunner | None = None,
) -> tuple[Trained, JsonObject]:
    """Train on `device` (a sharded method's shards where `shards` runs them; None: here);
    the state and statistics come back on CPU."""
    inputs = training_inputs_to(inputs, device)
    spec, data, test = inputs.spec, inputs.data, inputs.test
    if inputs.imported is not None:
        trained = _load_imported(spec, inputs.imported, inputs.imported_bytes)
    else:
        retained = RetainedData(data.sample_ids, data.X, data.y, data.subjects, data.external_ids)
        trained = fit(spec, retained, progress, shards)
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
        "noise_free_norm": weights_norm(trained.state),  # the utility floor's scale
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
    """Record 'epoch k of E', the loss and the time left at the pace so far, at most twice a
    second (and at the last epoch)."""
    last, started = [0.0], time.perf_counter()

    def progress(epoch: int, epochs: int, loss: float) -> None:
        now = time.perf_counter()
        if epoch < epochs and now - last[0] < 0.5:
            return
        last[0] = now
        eta = (now - started) / epoch * (epochs - epoch) if epoch > 0 else None
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
                        eta_seconds=round(eta, 1) if eta is not None else None,
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
