"""Committing an update (DESIGN §6): `commit_update` writes the new version, one chained
certificate per request, the removals, the purge of older versions and the request states
together, or nothing at all; `withdraw_model` and `fail_tasks` are the commits of an update
that cannot happen (the data is erased whatever happens to the update)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Row, delete, select
from sqlalchemy.orm import Session

from app.core.db.bulk import insert_together
from app.core.db.chunks import chunked
from app.core.db.tables import (
    Certificate,
    DeletionRequest,
    DeletionTask,
    Model,
    ModelSample,
    SampleStatistic,
    utcnow,
)
from app.core.jsontypes import json_object
from app.core.ledger.certificates import append_certificates
from app.core.states import ModelStatus, RequestStatus, Stage, TaskStatus, VersionKind
from app.core.storage.blobs import Blobs
from app.core.storage.crypto import Keyring
from app.core.storage.erasure import erase_payloads
from app.core.storage.keystore import KeyTable, destroy_keys
from app.core.webhooks import events
from app.core.wire import Progress
from workers import statements as sql
from workers.certify import certificate_for
from workers.context import JobContext
from workers.lease import WORKER_ID, LeaseLost
from workers.statistics import delete_rows, write_block
from workers.store import VersionBlobs
from workers.values import Batch, Outcome

log = logging.getLogger("lethe.commit")


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
    the caller's commit; on PostgreSQL in one statement (`bulk.insert_together`)."""
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
    app/core/ledger's own Core INSERTs: through the ORM, most of the worker's Python per deletion
    went to its flushes."""
    session.autoflush = False  # the commit's own session (db.run makes one per attempt)
    _check_lease_at(session, batch)
    if outcome is None:  # nothing to remove: the tasks finish as an earlier version left them
        _finish_tasks(session, batch, None, {})
        finish_requests(session, ctx.keyring, {t.request_id for t in batch.tasks})
        return None
    assert stored is not None, "a release's blobs are stored before its commit"
    version = write_release(session, ctx, batch, outcome, stored)
    certs = _certify(session, batch, outcome, version, signer)
    events.version_published(
        session,
        batch.model_id,
        version.number,
        outcome.decision.release.version_kind,
        version.weights_sha256,
        sorted(c.id for c in certs.values()),
    )
    _finish_tasks(session, batch, version, certs)
    blob_keys = supersede(session, ctx, batch, outcome, version)
    finish_requests(session, ctx.keyring, {t.request_id for t in batch.tasks}, also=blob_keys)
    return version.id


def write_release(
    session: Session,
    ctx: JobContext,
    batch: Batch,
    outcome: Outcome,
    stored: VersionBlobs,
    more: dict[str, Any] | None = None,
) -> VersionRow:
    """The new version's row, its metrics (with `more`, and the training record a method
    keeps): a deletion batch's or a learned version's (workers/learning.py)."""
    release = outcome.decision.release
    metrics = {
        **outcome.metrics,
        "rows_loaded": batch.rows_loaded,
        **(more or {}),
        **({"record": json_object(release.record)} if release.record else {}),
    }
    return write_version(
        session,
        ctx.blobs,
        batch.model_id,
        batch.number or batch.parent_number + 1,
        batch.parent_id,
        release.version_kind,
        stored,
        metrics,
    )


def _certify(
    session: Session,
    batch: Batch,
    outcome: Outcome,
    version: VersionRow,
    signer: Ed25519PrivateKey,
) -> dict[int, Certificate]:
    """A certificate for each task that removed rows, appended to the log in one INSERT:
    task id -> its certificate."""
    certified = [t for t in batch.tasks if batch.removed_by_task[t.task_id]]
    if not certified:
        return {}
    fields = [
        certificate_for(
            batch,
            t,
            outcome,
            version.number,
            version.weights_sha256,
            batch.removed_by_task[t.task_id],
        )
        for t in certified
    ]
    appended = append_certificates(session, fields, signer)
    return {t.task_id: c for t, c in zip(certified, appended, strict=True)}


def _finish_tasks(
    session: Session,
    batch: Batch,
    version: VersionRow | None,
    certs: dict[int, Certificate],
) -> None:
    """Each task done: with its certificate and its samples marked removed at `version`, or,
    where it removed nothing, with the certificate of the version that removed them."""
    conn, now = session.connection(), utcnow()
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


def supersede(
    session: Session, ctx: JobContext, batch: Batch, outcome: Outcome, version: VersionRow
) -> list[UUID]:
    """The new version becomes current: the per-sample statistics follow it, older versions
    are purged; returns their blobs' keys, destroyed with the requests' openings in one
    DELETE."""
    release = outcome.decision.release
    if release.replace_statistics is not None:  # a retrain re-recorded everything
        write_block(session, ctx.keyring, batch.model_id, release.replace_statistics, replace=True)
    else:
        delete_rows(session, batch.model_id, release.statistics_to_delete)
    blob_keys = _purge_older_versions(session, ctx.blobs, batch.model_id, version.id, destroy=False)
    session.connection().execute(
        sql.MAKE_CURRENT, {"model_id": batch.model_id, "version": version.id, "now": utcnow()}
    )
    return blob_keys


def _check_lease_at(session: Session, batch: Batch) -> None:
    """LeaseLost unless this worker still holds the model's lease, the model is still at the
    batch's parent version and every task of the batch still runs under this worker: one
    SELECT when the tasks fit in one chunk (a round trip less on every commit)."""
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
    waits for an update that cannot happen. Returns the requests it finished."""
    model = session.get(Model, model_id)
    if model is None:
        return set()
    _purge_older_versions(session, store, model_id, None)
    session.execute(delete(SampleStatistic).where(SampleStatistic.model_id == model_id))
    model.status, model.current_version_id = ModelStatus.failed, None
    model.error = f"withdrawn: {reason}"[:2000]
    model.progress = Progress(stage=Stage.withdrawn)
    events.model_withdrawn(session, model_id, reason)
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
    finish_requests(session, store.ring, requests)
    return requests


def finish_requests(
    session: Session, ring: Keyring, request_ids: set[int], also: Sequence[UUID] = ()
) -> None:
    """A request is done when all its models are; only then are its payloads erased. The
    short keys `also` (a commit's purged blobs') are destroyed with the finished requests'
    openings (one DELETE, a round trip less per commit)."""
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
    finished: list[int] = []
    for request in found.values():
        status, finished_at = _settled(request, statuses[request.id], now)
        key = request.commitment_key_id
        if finished_at is not None and key is not None:
            # the opening now lives with the requester alone: destroy the server's copy
            openings.append(key)
            key = None
        if status == RequestStatus.done:
            erased.update(request.sample_ids)
        if request.finished_at is None and finished_at is not None:
            finished.append(request.id)
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
    events.deletion_completed(session, finished)  # in this commit: the outbox
    # one DELETE of data keys for the payloads' and the openings' (statements are
    # most of a warm update's commit)
    erase_payloads(session, ring, sorted(erased), also=[*openings, *also])


def _settled(request: Any, seen: set[str], now: datetime) -> tuple[str, datetime | None]:
    """A request's status and finish time by its tasks': done when all are, failed when one
    failed and none is left to run, else as it was."""
    if seen <= {TaskStatus.done}:
        return RequestStatus.done, now
    if TaskStatus.failed in seen and not seen & {TaskStatus.queued, TaskStatus.running}:
        return RequestStatus.failed, now
    return request.status, request.finished_at


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
