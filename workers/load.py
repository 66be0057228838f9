"""Loading an update (DESIGN §6): `load_batch` reads everything the update needs in one short
read (the resident session supplies the retained rows, the noise-free state and the test
split, so only what the requests name is read: O(k)); `warm_session` makes a model's session
ahead of its next update. No database access happens after the load."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import torch
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db.chunks import chunked
from app.core.db.tables import (
    Dataset,
    DeletionRequest,
    Model,
    ModelSample,
    ModelVersion,
)
from app.core.ledger.certificates import lineage_history
from app.core.phases import Phases
from app.core.services.utility_floor import public_norm
from app.core.specs import PrivacyPolicy, architecture_of, training_of
from app.core.states import Guarantee, ModelStatus, SampleStatus, VersionKind
from app.core.storage.blobs import BlobMissing, Blobs
from app.core.storage.crypto import Keyring, SealError
from methods import RETRAIN, MethodChoice, get_method, method_of
from methods.compute import (
    ModelSpec,
    PrivacyTarget,
    RetainedData,
    UpdateInputs,
    method_for,
)
from workers import statements as sql
from workers import tensorfile
from workers.context import JobContext
from workers.data import OpenedSamples, database_key, test_arrays, training_arrays
from workers.device import CPU
from workers.metrics import RESIDENT_STATES_HANDED_OVER
from workers.resident import ModelSession, Sessions, TrainingRecord
from workers.statistics import read_vectors
from workers.store import release_metadata
from workers.values import Batch, ClaimedTask

log = logging.getLogger("lethe.load")


def model_spec(model: Model, dataset: Dataset) -> ModelSpec:
    policy = model.privacy
    return ModelSpec(
        architecture=architecture_of(model.architecture),
        training=training_of(model.training),
        method=method_of(model.method),
        n_features=int(np.prod(dataset.feature_shape)),
        n_classes=dataset.n_classes,
        vocabulary=tuple(dataset.text["words"]) if dataset.text else None,
        target=PrivacyTarget(policy.epsilon, policy.delta),
    )


def training_record(session: Session, model_id: int) -> tuple[dict[str, Any] | None, np.ndarray]:
    """The newest version's training record, and the samples removed since it was made
    (int64, ascending)."""
    versions = session.execute(
        select(ModelVersion.id, ModelVersion.number, ModelVersion.metrics)
        .where(ModelVersion.model_id == model_id)
        .order_by(ModelVersion.number.desc())
    ).all()
    for _, number, metrics in versions:
        if metrics and metrics.get("record"):
            later = [vid for vid, n, _ in versions if n > number]
            removed = session.scalars(
                select(ModelSample.sample_id).where(
                    ModelSample.model_id == model_id,
                    ModelSample.removed_version_id.in_(later or [-1]),
                )
            ).all()
            return metrics["record"], np.unique(np.asarray(removed, dtype=np.int64))
    return None, np.empty(0, dtype=np.int64)


def load_batch(
    session: Session,
    ctx: JobContext,
    model_id: int,
    tasks: list[ClaimedTask],
    device: torch.device = CPU,
) -> tuple[Batch, UpdateInputs]:
    """Everything the update needs, in one read: no database access happens after this.

    With `sessions`, the model's resident session at the current version supplies the
    retained rows, the noise-free state and the test split, and only what the requests name
    is read (O(k)); without one (or at another version) they are read and a session is made,
    its rows on `device` (the worker's)."""
    model, dataset, parent = session.execute(  # one read for the three rows
        select(Model, Dataset, ModelVersion)
        .join(Dataset, Dataset.id == Model.dataset_id)
        .join(ModelVersion, ModelVersion.id == Model.current_version_id)
        .where(Model.id == model_id)
    ).one()
    assert parent.state_key is not None
    where, sessions = database_key(session.get_bind().engine), ctx.resident_sessions()
    warm = sessions.take(where, model_id, parent.id)
    rows_loaded = 0
    resident = warm.method_state if warm is not None else None  # the method's, from the session
    spec = model_spec(model, dataset)
    if warm is None:
        keeps = sessions.capacity > 0  # the session holds the rows
        warm, rows_loaded = _cold_session(session, ctx, model_id, parent, dataset, keeps, device)
        resident = _handed_over(sessions, where, warm, spec)  # a deletion before the warm-up
    else:
        warm = _with_current_test(session, ctx.opened, dataset, warm)
    if warm.history is None:  # read once per session, then extended by each commit
        warm = replace(warm, history=tuple(lineage_history(session, model_id)))
    held = _held(session, model_id, sorted({s for t in tasks for s in t.sample_ids}))
    removed_by_task: dict[int, list[int]] = {}
    claimed: set[int] = set()
    for t in tasks:  # a sample asked for twice is removed once, credited to the first request
        mine = [s for s in t.sample_ids if s in held and s not in claimed]
        claimed.update(mine)
        removed_by_task[t.task_id] = mine
    requested = {t.method for t in tasks if t.method}
    if not warm.state:  # the state could not be read back (_parent_state): retrain exactly
        requested.add(RETRAIN)
    method = method_of({"name": RETRAIN}) if RETRAIN in requested else spec.method
    record, previously_removed = None, []  # only a method that records training has a record
    if spec.method.spec.records_training:
        if warm.record is None:  # read once per session, then kept by each commit
            warm = replace(warm, record=TrainingRecord(*training_record(session, model_id)))
        assert warm.record is not None
        record, previously_removed = warm.record.record, warm.record.removed_since.tolist()
    removed_ids = sorted(claimed)
    statistics = (
        read_vectors(session, ctx.keyring, model_id, removed_ids)
        if get_method(method.name).uses_statistics
        else {}
    )
    removed, retained = warm.split(removed_ids, statistics, previously_removed)
    test = warm.test
    batch = Batch(
        model_id=model_id,
        policy=model.privacy,
        parent_id=parent.id,
        parent_number=parent.number,
        tasks=tasks,
        number=max(parent.number, model.version_floor) + 1,
        removed_by_task=removed_by_task,
        external_ids=warm.external_ids_of(removed_ids),  # raw ids, for the commitment
        openings=_openings(session, ctx.keyring, {t.request_id for t in tasks}),
        session=warm,
        rows_loaded=rows_loaded,
        chosen_by=model.method.chosen_by,
        publish_at=_publish_at(session, model.privacy, tasks),
        weights_metadata=release_metadata(
            model,
            dataset,
            max(parent.number, model.version_floor) + 1,
            parent,
            VersionKind.unlearned,
        ),
    )
    inputs = UpdateInputs(
        model_id=model_id,
        spec=spec,
        method=method,
        policy=batch.policy,
        target=batch.target(),
        state=dict(warm.state),
        removed=removed,
        retained=retained,
        test=RetainedData(test.sample_ids, test.X, test.y, test.subjects, test.external_ids),
        history=list(warm.history or ()),
        record=record,
        resident=resident if method.name == spec.method.name else None,
        public_norm=_floor_scale(session, model_id, method, batch.policy),
    )
    return batch, inputs


def _publish_at(
    session: Session, policy: PrivacyPolicy, tasks: list[ClaimedTask]
) -> datetime | None:
    """Constant-time publication's deadline: the newest request's acceptance plus the
    policy's `publish_after_seconds` (public values only); None where the policy sets none."""
    if policy.publish_after_seconds is None:
        return None
    accepted = session.scalar(
        select(func.max(DeletionRequest.created_at)).where(
            DeletionRequest.id.in_({t.request_id for t in tasks})
        )
    )
    if accepted is None:
        return None
    if accepted.tzinfo is None:  # an aggregate SQLite hands back without its offset
        accepted = accepted.replace(tzinfo=UTC)
    return accepted + timedelta(seconds=policy.publish_after_seconds)


def _floor_scale(
    session: Session, model_id: int, method: MethodChoice, policy: PrivacyPolicy
) -> float | None:
    """The utility floor's scale, read only where the floor can apply: a floor is set and
    the method's releases are noisy."""
    if policy.max_relative_noise is None or method.spec.guarantee == Guarantee.exact:
        return None
    return public_norm(session, model_id)


def warm_session(ctx: JobContext, model_id: int, device: torch.device) -> bool:
    """Make the model's resident session ahead of its next update (the rows, the state, the
    method's resident state: convex_head's anchored Hessians), as a worker that replaced one
    which gave way after an erasure does (workers/recycle.py), so that update runs warm.
    Reads in one transaction, computes with none open; False when there is nothing to do."""
    sessions = ctx.resident_sessions()
    if sessions.capacity <= 0:
        return False
    phases = Phases()
    with ctx.db.read() as session:
        found = session.execute(
            select(Model, Dataset, ModelVersion)
            .join(Dataset, Dataset.id == Model.dataset_id)
            .join(ModelVersion, ModelVersion.id == Model.current_version_id)
            .where(Model.id == model_id)
        ).first()
        if found is None or found[0].status != ModelStatus.ready:
            return False
        model, dataset, parent = found
        where = database_key(session.get_bind().engine)
        if sessions.take(where, model_id, parent.id) is not None:
            return False
        made, _ = _cold_session(session, ctx, model_id, parent, dataset, True, device)
        made = replace(made, history=tuple(lineage_history(session, model_id)))
        spec = model_spec(model, dataset)
    phases.mark("read")
    if not made.state:
        return False
    prepared = _handed_over(sessions, where, made, spec)
    if prepared is not None:
        phases.mark("handed over")
    else:
        _, retained = made.split([], {}, [])
        prepared = method_for(spec.method.name, spec).prepare(retained, dict(made.state))
        phases.mark("prepare")
    if prepared is not None:
        made = replace(made, method_state=prepared)
    sessions.put(where, made)
    log.info("model %s: session warmed, %d rows: %s", model_id, len(made), phases)
    return True


def _handed_over(
    sessions: Sessions, where: str, made: ModelSession, spec: ModelSpec
) -> object | None:
    """The method state the process this one replaced handed over for `made`'s model, taken
    and imported where it describes `made`'s version on its rows (workers/handover.py); None
    otherwise (the method then prepares anew, or its first update anchors)."""
    handed = sessions.handed(where, made.model_id)
    if handed is None or handed.version_id != made.version_id or not made.state:
        return None
    _, retained = made.split([], {}, [])
    method = method_for(spec.method.name, spec)
    imported = method.import_resident(handed.tensors, retained, dict(made.state))
    if imported is not None:
        RESIDENT_STATES_HANDED_OVER.inc()
    return imported


def _cold_session(
    session: Session,
    ctx: JobContext,
    model_id: int,
    parent: ModelVersion,
    dataset: Dataset,
    hand_over: bool,
    device: torch.device,
) -> tuple[ModelSession, int]:
    """The model's session read from the database: its retained rows, the parent version's
    noise-free state and the test split; and how many training rows that read. `hand_over`:
    the session will be kept, so the opened-samples cache gives the rows up to it."""
    assert parent.state_key is not None
    state = _parent_state(session, ctx.blobs, parent)
    rows = training_arrays(session, ctx.opened, model_id, dataset, hand_over=hand_over)
    # the rows that left counted before the split: a row leaving between the two reads
    # makes the next count differ, not match
    left = test_rows_left(session, dataset.id)
    test = test_arrays(session, ctx.opened, dataset)
    made = ModelSession.of(model_id, parent.id, rows, state, test, device)
    made = replace(made, test_left=left)  # dated: read once
    return made, len(rows)


def _parent_state(session: Session, store: Blobs, parent: ModelVersion) -> dict[str, torch.Tensor]:
    """The parent version's noise-free state, or {} when it cannot be read back (a corrupt or
    missing object): the update is then the exact retrain from the retained rows,
    which needs no state (`load_batch`), rather than a failure that withdraws the model. An
    unreachable store is not this: it raises, and the update waits."""
    assert parent.state_key is not None
    try:
        data = store.read(session, parent.state_key)
        if data is None:
            raise LookupError(f"the state of version {parent.number} is missing")
        return tensorfile.decode(data)
    except (SealError, BlobMissing, LookupError, ValueError) as exc:
        log.warning("version %s's state cannot be read (%s); retraining exactly", parent.id, exc)
        return {}


def _with_current_test(
    session: Session, opened: OpenedSamples, dataset: Dataset, warm: ModelSession
) -> ModelSession:
    """The session with the test split as it is now. Test rows only ever leave (a sample is
    active, then erasing, then erased), so an unchanged count of rows that left means an
    unchanged split: counted from ix_samples_dataset_split_status over the few rows that
    left, not the many still active. A session that never counted them reads the
    split once."""
    left = test_rows_left(session, dataset.id)
    if left == warm.test_left:
        return warm
    fresh = test_arrays(session, opened, dataset)  # the cache's own arrays: not grown in place
    return replace(warm, test=fresh, test_left=left, test_owned=False)


def test_rows_left(session: Session, dataset_id: int) -> int:
    """How many of the dataset's test rows have left (erasing or erased): read before the
    split (statements of a read do not share a snapshot on PostgreSQL), it dates the split for
    `_with_current_test`. One count per status, each an equality on all three columns of
    ix_samples_dataset_split_status, so only the rows that left are visited: with
    `status IN (...)` PostgreSQL filtered every test row of the dataset (before the
    table was first analysed)."""
    params = {
        "dataset_id": dataset_id,
        "erasing": SampleStatus.erasing,
        "erased": SampleStatus.erased,
    }
    return int(session.connection().execute(sql.TEST_ROWS_LEFT, params).scalar() or 0)


def _openings(session: Session, ring: Keyring, request_ids: set[int]) -> dict[int, bytes]:
    """The requests' commitment keys, where the server still keeps them."""
    conn, out = session.connection(), dict[int, bytes]()
    for chunk in chunked(sorted(request_ids)):
        out.update((r, ring.unwrap(w)) for r, w in conn.execute(sql.OPENINGS, {"ids": chunk}))
    return out


def _held(session: Session, model_id: int, sample_ids: list[int]) -> set[int]:
    """Those of `sample_ids` the model still holds."""
    held: set[int] = set()
    conn = session.connection()
    for chunk in chunked(sample_ids):
        held.update(conn.execute(sql.HELD, {"model_id": model_id, "ids": chunk}).scalars())
    return held
