"""The transactions of the deletion pipeline (DESIGN §6): claim, load, commit, fail.

Each function is one unit of work. `load_batch` reads everything an update needs in one short
read; `commit_update` writes the new version, one chained certificate per request, the
removals, the purge of older versions and the request states together, or nothing at all.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Row, delete, select
from sqlalchemy.orm import Session

from app.db.bulk import insert_together
from app.db.chunks import chunked
from app.db.session import Database
from app.db.tables import (
    Certificate,
    Dataset,
    DeletionRequest,
    DeletionTask,
    Model,
    ModelSample,
    ModelVersion,
    SampleStatistic,
    utcnow,
)
from app.jsontypes import json_object
from app.ledger.certificates import append_certificates, lineage_history, removed_ids_commitment
from app.specs import architecture_of, training_of
from app.states import ModelStatus, RequestStatus, SampleStatus, Stage, TaskStatus, VersionKind
from app.storage.blobs import BlobMissing, Blobs, WrittenBlob
from app.storage.crypto import Keyring, SealError
from app.storage.erasure import erase_payloads
from app.storage.keystore import KeyTable, destroy_keys
from app.wire import Progress
from methods import get_method, method_of
from methods.compute import (
    ModelSpec,
    ModelState,
    PrivacyTarget,
    Release,
    RetainedData,
    UpdateInputs,
    method_for,
)
from workers import statements as sql
from workers import tensorfile
from workers.certify import CertificateContext, certificate_fields
from workers.context import JobContext
from workers.data import OpenedSamples, database_key, test_arrays, training_arrays
from workers.device import CPU
from workers.lease import WORKER_ID, LeaseLost
from workers.resident import ModelSession, TrainingRecord
from workers.statistics import delete_rows, read_vectors, write_block
from workers.values import Batch, ClaimedTask, Outcome

log = logging.getLogger("lethe.pipeline")


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


def check_lease(session: Session, model_id: int) -> Model:
    """The model row, if this worker still holds its lease (else LeaseLost: do not commit)."""
    model = session.get(Model, model_id)
    if model is None or model.lease_owner != WORKER_ID:
        owner = model.lease_owner if model is not None else None
        raise LeaseLost(f"model {model_id} is now leased by {owner}")
    return model


def weights_metadata(
    session: Session, model_id: int, number: int, parent_id: int | None, kind: VersionKind
) -> dict[str, str]:
    """String metadata of a released safetensors file: the architecture spec and the shapes
    that rebuild it (`lethe.load_model`), and where the version sits in its chain."""
    model = session.get(Model, model_id)
    assert model is not None
    dataset = session.get(Dataset, model.dataset_id)
    assert dataset is not None
    parent = session.get(ModelVersion, parent_id) if parent_id is not None else None
    return release_metadata(model, dataset, number, parent, kind)


def release_metadata(
    model: Model, dataset: Dataset, number: int, parent: ModelVersion | None, kind: VersionKind
) -> dict[str, str]:
    """`weights_metadata` from rows already read (an update reads them in its load)."""
    return {
        "format": "lethe/1",
        "model_id": str(model.id),
        "version": str(number),
        "kind": str(kind),
        "parent_sha256": parent.weights_sha256 if parent is not None else "",
        "architecture": json.dumps(model.architecture.model_dump(mode="json"), sort_keys=True),
        "method": model.method.name,
        "n_features": str(int(np.prod(dataset.feature_shape))),
        "feature_shape": json.dumps(list(dataset.feature_shape)),
        "n_classes": str(dataset.n_classes),
        **method_of(model.method).weights_metadata(),
    }


@dataclass(frozen=True)
class VersionBlobs:
    """A version's weights and noise-free state, sealed and stored before the commit that
    records them (issue 29): no transaction is open while they stream out."""

    weights: WrittenBlob
    state: WrittenBlob

    @property
    def both(self) -> tuple[WrittenBlob, WrittenBlob]:
        return self.weights, self.state


def store_version_blobs(
    db: Database,
    store: Blobs,
    model_id: int,
    number: int,
    parent_id: int | None,
    kind: VersionKind,
    weights: ModelState,
    next_state: ModelState,
) -> VersionBlobs:
    """Seal and store a version's downloadable weights (with what a loader needs in their
    safetensors metadata, `weights_metadata`) and its noise-free state."""
    with db.read() as session:
        metadata = weights_metadata(session, model_id, number, parent_id, kind)
    return store_blobs(store, model_id, metadata, weights, next_state)


def store_blobs(
    store: Blobs,
    model_id: int,
    metadata: dict[str, str],
    weights: ModelState,
    next_state: ModelState,
) -> VersionBlobs:
    """Seal and store a version's weights under `metadata` and its noise-free state, each as
    a stream of views of the tensors' own memory (workers/tensorfile.py)."""

    def state() -> WrittenBlob:
        _, stream = tensorfile.encode(next_state)
        return store.write(f"model-{model_id}/state", stream, digest=False)

    # the two are written at once: each ends in an fsync of its file and of its folder (about
    # 4 ms a deletion for the four on the development machine), which release the GIL. One
    # that fails leaves the other unreferenced: the sweeper removes it.
    writing = _WRITER.submit(state)
    _, stream = tensorfile.encode(weights, metadata)
    stored_weights = store.write(f"model-{model_id}/weights", stream)
    return VersionBlobs(stored_weights, writing.result())


_WRITER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lethe-blob")


@dataclass(frozen=True)
class VersionRow:
    """A version just written: what its certificates and the rest of its commit use."""

    id: int
    number: int
    weights_sha256: str


def write_version(
    session: Session,
    store: Blobs,
    model_id: int,
    number: int,
    parent_id: int | None,
    kind: VersionKind,
    stored: VersionBlobs,
    metrics: dict[str, Any],
) -> VersionRow:
    """Record a version whose blobs are stored: their keys and rows and the version row, in
    the caller's commit; on PostgreSQL in one statement (`bulk.insert_together`: issue 28)."""
    metrics = {
        **metrics,
        "storage": {
            "weights_bytes": stored.weights.size,
            "state_bytes": stored.state.size,
            "location": stored.weights.location,
        },
    }
    row = {
        "model_id": model_id,
        "number": number,
        "parent_id": parent_id,
        "kind": kind,
        "weights_key": stored.weights.key,
        "weights_sha256": stored.weights.sha256,
        "weights_size": stored.weights.size,
        "state_key": stored.state.key,
        "metrics": metrics,
        "n_train": int(metrics.get("n_train", 0)),
        "created_at": utcnow(),
    }
    blob_rows = store.rows(*stored.both)
    (inserted,) = insert_together(
        session.connection(), blob_rows, (sql.VERSIONS, [row]), (sql.VERSIONS.c.id,)
    )
    return VersionRow(inserted.id, number, stored.weights.sha256)


def store_release(store: Blobs, batch: Batch, release: Release) -> VersionBlobs:
    """The blobs of the version a batch's update releases, their metadata from the batch's
    load: no database access here."""
    metadata = {**batch.weights_metadata, "kind": str(release.version_kind)}
    return store_blobs(store, batch.model_id, metadata, release.weights, release.next_state)


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
    if warm is None:
        keeps = sessions.capacity > 0  # the session holds the rows
        warm, rows_loaded = _cold_session(session, ctx, model_id, parent, dataset, keeps, device)
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
    spec = model_spec(model, dataset)
    requested = {t.method for t in tasks if t.method}
    if not warm.state:  # the state could not be read back (_parent_state): retrain exactly
        requested.add("retrain")
    method = method_of({"name": "retrain"}) if "retrain" in requested else spec.method
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
        removed_by_task=removed_by_task,
        external_ids=warm.external_ids_of(removed_ids),  # raw ids, for the commitment
        openings=_openings(session, ctx.keyring, {t.request_id for t in tasks}),
        session=warm,
        rows_loaded=rows_loaded,
        weights_metadata=release_metadata(
            model, dataset, parent.number + 1, parent, VersionKind.unlearned
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
    )
    return batch, inputs


def warm_session(ctx: JobContext, model_id: int, device: torch.device) -> bool:
    """Make the model's resident session ahead of its next update (the rows, the state, the
    method's resident state: convex_head's anchored Hessians), as a worker that replaced one
    which gave way after an erasure does (workers/recycle.py), so that update runs warm.
    Reads in one transaction, computes with none open; False when there is nothing to do."""
    sessions = ctx.resident_sessions()
    if sessions.capacity <= 0:
        return False
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
    if not made.state:
        return False
    _, retained = made.split([], {}, [])
    prepared = method_for(spec.method.name, spec).prepare(retained, dict(made.state))
    if prepared is not None:
        made = replace(made, method_state=prepared)
    sessions.put(where, made)
    return True


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
    missing object: issue 53): the update is then the exact retrain from the retained rows,
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
    left, not the many still active (issue 28). A session that never counted them reads the
    split once."""
    left = test_rows_left(session, dataset.id)
    if left == warm.test_left:
        return warm
    return replace(warm, test=test_arrays(session, opened, dataset), test_left=left)


def test_rows_left(session: Session, dataset_id: int) -> int:
    """How many of the dataset's test rows have left (erasing or erased): read before the
    split (statements of a read do not share a snapshot on PostgreSQL), it dates the split for
    `_with_current_test`. One count per status, each an equality on all three columns of
    ix_samples_dataset_split_status, so only the rows that left are visited: with
    `status IN (...)` PostgreSQL filtered every test row of the dataset (10 ms at 20,000,
    before the table was first analysed)."""
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


def commit_update(
    session: Session,
    ctx: JobContext,
    batch: Batch,
    outcome: Outcome | None,
    stored: VersionBlobs | None,
    signer: Ed25519PrivateKey,
) -> int | None:
    """Apply the update atomically, recording the `stored` blobs of its release, the log's new
    head signed by `signer`; returns the new version id (None if nothing to remove).

    The rows are written with Core statements built once (workers/statements.py), each
    executed where it stands; the certificates, the trees' nodes and the signed head by
    app/ledger's own Core INSERTs. Through the ORM the commit took 25 ms of a distributed
    worker's Python per deletion, 10 of them in flushes; this way 16 (issue 28,
    bench.profile_update --gil), before the log's rows left the ORM too."""
    session.autoflush = False  # the commit's own session (db.run makes one per attempt)
    _check_lease_at(session, batch)
    version = None
    if outcome is not None:
        assert stored is not None, "a release's blobs are stored before its commit"
        release = outcome.decision.release
        metrics = {
            **outcome.metrics,
            "rows_loaded": batch.rows_loaded,
            **({"record": json_object(release.record)} if release.record else {}),
        }
        version = write_version(
            session,
            ctx.blobs,
            batch.model_id,
            batch.parent_number + 1,
            batch.parent_id,
            release.version_kind,
            stored,
            metrics,
        )
    certs: dict[int, Certificate] = {}  # task id -> its certificate, one INSERT for all
    certified = [t for t in batch.tasks if batch.removed_by_task[t.task_id]]
    if certified and version is not None and outcome is not None:
        fields = [
            _certificate(batch, t, outcome, version, batch.removed_by_task[t.task_id])
            for t in certified
        ]
        appended = append_certificates(session, fields, signer)
        certs = {t.task_id: c for t, c in zip(certified, appended, strict=True)}
    conn, now = session.connection(), utcnow()
    blob_keys: list[UUID] = []
    removals: list[dict[str, int]] = []
    certified_rows: list[dict[str, Any]] = []
    earlier_rows: list[dict[str, Any]] = []
    for task in batch.tasks:
        removed = batch.removed_by_task[task.task_id]
        cert = certs.get(task.task_id)
        row: dict[str, Any] = {
            "task_id": task.task_id,
            "done": TaskStatus.done,
            "removed": len(removed),
            "now": now,
        }
        if cert is not None and version is not None:
            removals += [
                {
                    "model": batch.model_id,
                    "sample": s,
                    "version": version.id,
                    "certificate": cert.id,
                }
                for s in removed
            ]
            certified_rows.append(row | {"certificate": cert.id, "version": version.id})
        else:
            certificate = _earlier_certificate(session, batch.model_id, task.sample_ids)
            earlier_rows.append(row | {"certificate": certificate})
    for statement, rows in (
        (sql.FINISH_TASK, certified_rows),
        (sql.FINISH_TASK_AS_BEFORE, earlier_rows),
    ):
        if rows:
            conn.execute(statement, rows)
    if removals:  # one row each; these samples were held (checked under lease)
        conn.execute(sql.REMOVE_SAMPLE, removals)
    if version is not None and outcome is not None:
        release = outcome.decision.release
        if release.replace_statistics is not None:  # a retrain re-recorded everything
            write_block(
                session, ctx.keyring, batch.model_id, release.replace_statistics, replace=True
            )
        else:
            delete_rows(session, batch.model_id, release.statistics_to_delete)
        # their blobs' keys are destroyed with the requests' openings, in one DELETE
        blob_keys = _purge_older_versions(
            session, ctx.blobs, batch.model_id, version.id, destroy=False
        )
        conn.execute(
            sql.MAKE_CURRENT, {"model_id": batch.model_id, "version": version.id, "now": now}
        )
    finish_requests(session, {t.request_id for t in batch.tasks}, also=blob_keys)
    return version.id if version is not None else None


def _check_lease_at(session: Session, batch: Batch) -> None:
    """LeaseLost unless this worker still holds the model's lease, the model is still at the
    batch's parent version and every task of the batch still runs under this worker: one
    SELECT when the tasks fit in one chunk (a round trip less on every commit, issue 28)."""
    ids = [t.task_id for t in batch.tasks]
    first = next(chunked(ids), [])
    params = {
        "model_id": batch.model_id,
        "ids": first,
        "running": TaskStatus.running,
        "owner": WORKER_ID,
    }
    row = session.connection().execute(sql.LEASE, params).first()
    if row is None or row.lease_owner != WORKER_ID:
        owner = row.lease_owner if row is not None else None
        raise LeaseLost(f"model {batch.model_id} is now leased by {owner}")
    if row.current_version_id != batch.parent_id:
        raise LeaseLost(f"model {batch.model_id} moved past version {batch.parent_number}")
    if row.tasks_held != len(first) or len(first) < len(ids):
        _check_tasks(session, ids)  # which one was reclaimed, or the chunks after the first


def _check_tasks(session: Session, ids: list[int]) -> None:
    """LeaseLost unless every one of these tasks still runs under this worker."""
    held: set[int] = set()
    for chunk in chunked(ids):
        params = {"ids": chunk, "running": TaskStatus.running, "owner": WORKER_ID}
        held.update(session.connection().execute(sql.TASKS_HELD, params).scalars())
    for task_id in ids:
        if task_id not in held:
            raise LeaseLost(f"task {task_id} was reclaimed")


def _certificate(
    batch: Batch, task: ClaimedTask, outcome: Outcome, version: VersionRow, removed: list[int]
) -> dict[str, Any]:
    # A request without a kept key (accepted before issue 25) commits under a key nobody
    # keeps: the commitment cannot be opened, by anyone, which is what it must not leak.
    opening = batch.openings.get(task.request_id) or secrets.token_bytes(32)
    commitment = removed_ids_commitment(opening, [batch.external_ids[s] for s in removed])
    ctx = CertificateContext(
        request_id=task.request_id,
        model_id=batch.model_id,
        from_version=batch.parent_number,
        to_version=version.number,
        release_sha256=version.weights_sha256,
        n_removed=len(removed),
        n_removed_in_update=len(batch.removed),
        coalesced_requests=sorted({t.request_id for t in batch.tasks}),
        removed_ids_commitment=commitment,
    )
    return certificate_fields(outcome.decision, batch.policy, batch.target(), ctx)


def _earlier_certificate(session: Session, model_id: int, sample_ids: list[int]) -> int | None:
    """The certificate that already removed these samples from the model (applied once)."""
    for chunk in chunked(sample_ids):
        found = session.scalar(
            select(ModelSample.removed_certificate_id)
            .where(
                ModelSample.model_id == model_id,
                ModelSample.sample_id.in_(chunk),
                ModelSample.removed_certificate_id.is_not(None),
            )
            .limit(1)
        )
        if found is not None:
            return found
    return None


def _purge_older_versions(
    session: Session, store: Blobs, model_id: int, keep_id: int | None, destroy: bool = True
) -> list[UUID]:
    """Every earlier version was trained with the removed samples: delete its bytes (all of
    them when `keep_id` is None). Returns its blobs' key ids, which with `destroy=False` the
    caller destroys in this transaction (`Blobs.retire`)."""
    conn = session.connection()
    params = {"model": model_id, "keep": keep_id if keep_id is not None else -1, "now": utcnow()}
    if conn.dialect.name == "postgresql":  # one statement
        return store.retired(session, conn.execute(sql.PURGE_AT_ONCE, params).all(), destroy)
    older = conn.execute(sql.OLDER_VERSIONS, params).all()
    if not older:
        return []
    keys = [k for v in older for k in (v.weights_key, v.state_key) if k]
    key_ids = store.retire(session, keys, destroy=destroy)
    conn.execute(sql.ERASE_VERSIONS, params | {"ids": [v.id for v in older]})
    return key_ids


def withdraw_model(session: Session, store: Blobs, model_id: int, reason: str) -> set[int]:
    """The model cannot forget (its update and its exact retrain both failed): withdraw it.

    Every version's weights and noise-free state are deleted with their data keys, its
    per-sample statistics too, and the model is marked failed with the reason; its open
    deletion tasks are done, applied by the withdrawal. A failed model holds no sample
    (`erase_payloads`), so the requests' data is erased in this same commit: erasure never
    waits for an update that cannot happen (issue 25). Returns the requests it finished."""
    model = session.get(Model, model_id)
    if model is None:
        return set()
    _purge_older_versions(session, store, model_id, None)
    session.execute(delete(SampleStatistic).where(SampleStatistic.model_id == model_id))
    model.status, model.current_version_id = ModelStatus.failed, None
    model.error = f"withdrawn: {reason}"[:2000]
    model.progress = Progress(stage=Stage.withdrawn)
    tasks = session.scalars(
        select(DeletionTask).where(
            DeletionTask.model_id == model_id,
            DeletionTask.status.in_([TaskStatus.queued, TaskStatus.running, TaskStatus.failed]),
        )
    ).all()
    note = f"the model was withdrawn instead of updated: {reason}"[:2000]
    for task in tasks:
        task.status, task.error, task.n_removed = TaskStatus.done, note, 0
        task.lease_owner = task.lease_expires_at = None
    requests = {t.request_id for t in tasks}
    session.flush()
    finish_requests(session, requests)
    return requests


def finish_requests(session: Session, request_ids: set[int], also: Sequence[UUID] = ()) -> None:
    """A request is done when all its models are; only then are its payloads erased. The
    short keys `also` (a commit's purged blobs') are destroyed with the finished requests'
    openings (issue 28: one DELETE, a round trip less per commit)."""
    if not request_ids:
        destroy_keys(session, list(also), KeyTable.short)
        return
    statuses: dict[int, set[str]] = {r: set() for r in request_ids}
    found: dict[int, Row[Any, Any, Any, Any, Any, Any]] = {}
    conn = session.connection()
    for chunk in chunked(sorted(request_ids)):  # each request with its tasks' statuses
        for row in conn.execute(sql.REQUESTS_WITH_TASKS, {"ids": chunk}):
            found[row.id] = row
            statuses[row.id].add(row.task_status)
    now, openings, changed, erased = utcnow(), [], [], set[int]()
    for request in found.values():
        seen = statuses[request.id]
        status, finished_at = request.status, request.finished_at
        if seen <= {TaskStatus.done}:
            status, finished_at = RequestStatus.done, now
        elif TaskStatus.failed in seen and not seen & {TaskStatus.queued, TaskStatus.running}:
            status, finished_at = RequestStatus.failed, now
        key = request.commitment_key_id
        if finished_at is not None and key is not None:
            # the opening now lives with the requester alone: destroy the server's copy
            openings.append(key)
            key = None
        if status == RequestStatus.done:
            erased.update(request.sample_ids)
        before = (request.status, request.finished_at, request.commitment_key_id)
        if (status, finished_at, key) != before:
            changed.append(
                {
                    "request_id": request.id,
                    "outcome": status,
                    "finished": finished_at,
                    "key": key,
                    "now": now,
                }
            )
    if changed:
        conn.execute(sql.FINISH_REQUEST, changed)
    # one DELETE of data keys for the payloads' and the openings' (issue 28: statements are
    # most of a warm update's commit)
    erase_payloads(session, sorted(erased), also=[*openings, *also])


def release_tasks(
    session: Session, task_ids: list[int], delay_seconds: float = 0, why: str | None = None
) -> None:
    """Put claimed tasks back to queued, due after `delay_seconds`, their attempt not counted:
    the job was interrupted by a shutdown (app/shutdown.py) or a storage fault
    (app/storage/faults.py), not failed; `why` is what the request shows meanwhile."""
    due = utcnow() + timedelta(seconds=delay_seconds) if delay_seconds else None
    for task in session.scalars(select(DeletionTask).where(DeletionTask.id.in_(task_ids))):
        if task.status == TaskStatus.running and task.lease_owner == WORKER_ID:
            task.status, task.not_before = TaskStatus.queued, due
            task.error = why
            task.lease_owner = task.lease_expires_at = None
            task.attempts = max(0, task.attempts - 1)


def fail_tasks(
    session: Session,
    store: Blobs,
    task_ids: list[int],
    error: str,
    backoff_seconds: list[int],
    max_attempts: int,
) -> bool:
    """Put tasks back to queued, due again after the backoff for their attempt, or, after
    `max_attempts`, withdraw their model (`withdraw_model`): the data is erased whatever
    happens to the update. Returns True when the tasks failed for good."""
    final = False
    models: set[int] = set()
    now = utcnow()
    for task in session.scalars(select(DeletionTask).where(DeletionTask.id.in_(task_ids))):
        if task.status != TaskStatus.running or task.lease_owner != WORKER_ID:
            continue
        task.error = error[:2000]
        task.lease_owner = task.lease_expires_at = None
        if task.attempts >= max_attempts:
            task.status, final = TaskStatus.failed, True
            models.add(task.model_id)
        else:
            task.status = TaskStatus.queued
            wait = (
                backoff_seconds[min(task.attempts - 1, len(backoff_seconds) - 1)]
                if backoff_seconds
                else 0
            )
            task.not_before = now + timedelta(seconds=wait)
    for model_id in models:
        reason = f"a deletion failed {max_attempts} times ({error})"
        for request_id in withdraw_model(session, store, model_id, reason[:1000]):
            request = session.get(DeletionRequest, request_id)
            if request is not None:
                request.error = f"model {model_id} was withdrawn: {reason}"[:2000]
    return final
