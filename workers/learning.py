"""Learning appended rows, in the model's deletion job under its lease, once
no deletion is due (deletions come first): one `learned` version for every append waiting.

The update is the deletion pipeline's own: `load.load_batch` with no removal supplies the
resident session (its rows, state, lineage, the method's resident state), the appended rows
are opened (O(k)) and joined after the retained ones (`UpdateInputs.added`), and
`updates.compute_storing` decides: a method that `learns` adds them with its own update
(convex_head's Hessian update and Newton steps under the carried bound, released through its
mechanism; SISA's affected shards; minnorm's rank-k Gram update), any other the exact retrain
on the new set. The commit writes the version, its entry in the log (kind `learned`, request
0, with the lineage fields every release carries, so later certificates compose it), the
model's new training rows and the tasks' end, or nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.core import pause, shutdown
from app.core.db.bulk import insert_rows
from app.core.db.chunks import chunked
from app.core.db.tables import Base, Dataset, LearnTask, Model, ModelSample, Sample, utcnow
from app.core.jsontypes import JsonObject, JsonValue
from app.core.ledger.certificates import append_certificates, removed_ids_commitment
from app.core.ledger.transparency import signing_key
from app.core.phases import Phases
from app.core.states import ModelStatus, SampleStatus, TaskStatus
from app.core.storage.faults import is_fault
from app.core.webhooks import events
from methods.compute import RetainedData, UnlearningMethod, joined, method_for
from workers import load
from workers import store as blobs_of
from workers.advance import keep_resident
from workers.certify import CertificateContext, certificate_fields
from workers.claim import check_lease
from workers.commit import VersionRow, finish_requests, supersede, write_release
from workers.context import JobContext
from workers.data import Arrays, database_key, split_rows, stored_samples
from workers.lease import LeaseLost
from workers.metrics import JOB_DURATION, ROWS_LEARNED, VERSIONS_LEARNED
from workers.shards import shard_runner
from workers.updates import compute_storing
from workers.values import Batch, Outcome

log = logging.getLogger("lethe.learning")

MODEL_SAMPLES = Base.metadata.tables["model_samples"]


@dataclass(frozen=True)
class Learn:
    """The appends a learned version takes in: their tasks, and the model's new rows."""

    task_ids: list[int]
    append_ids: list[int]
    added: Arrays  # training rows the model does not hold yet, ids ascending
    test: Arrays  # the appends' test rows (they join the split the metrics read)
    per_append: dict[int, int]  # append id -> its rows among `added`
    dataset_id: int


def learn_due(ctx: JobContext, model_id: int, device: torch.device) -> tuple[int, bool]:
    """Learn every append waiting for this model (the caller holds its lease): (tasks
    finished, no failure)."""
    started, db, phases = time.perf_counter(), ctx.db, Phases()
    sessions, where = ctx.resident_sessions(), database_key(db.engine)
    with db.read() as session:
        due = _due(session, model_id)
        if not due:
            return 0, True
        batch, inputs = load.load_batch(session, ctx, model_id, [], device)
        phases.mark("load")
        learn = _opened(session, ctx, model_id, due)
        phases.mark("open")
    try:
        added = _retained(learn.added, device)
        test = _with_rows(inputs.test, learn.test, device)
        phases.mark("join")
        outcome, stored = None, None
        if len(added):
            inputs = replace(
                inputs,
                retained=joined(inputs.retained, added),
                added=added,
                test=test,
                shards=shard_runner(ctx, model_id),
            )
            outcome, stored = compute_storing(
                inputs,
                device,
                lambda release: blobs_of.store_release(ctx.blobs, batch, release),
                lambda stored: ctx.blobs.discard(stored.both),
            )
        phases.mark("compute")
        pause.point(ctx.settings, "before-learn-commit", model_id)  # (a crash: orphans, swept)
        signer = signing_key(ctx.settings)
        try:
            version_id = db.run(
                lambda session: commit_learned(session, ctx, batch, learn, outcome, stored, signer),
                retry_integrity=True,
            )
        except LeaseLost:
            if stored is not None:
                ctx.blobs.discard(stored.both)
            raise
    except shutdown.Interrupted:
        sessions.drop(where, model_id)
        return 0, False  # the tasks are still queued: the next start learns them
    except Exception as exc:
        sessions.drop(where, model_id)
        if is_fault(exc) or isinstance(exc, LeaseLost):
            log.warning("model %s: learning waits (%s)", model_id, exc)
            return 0, False
        log.exception("model %s: learning appends %s failed", model_id, learn.append_ids)
        error = exc
        db.run(lambda session: _failed(session, learn.task_ids, error))
        return len(learn.task_ids), False
    phases.mark("commit")
    log.info("model %s learned %d rows of appends %s: %s", model_id, len(added),
             learn.append_ids, phases)  # fmt: skip
    if outcome is not None:  # counted before the wake-up: seen learned, seen counted
        ctx.runtime.publisher.soon()  # a new log entry for the witnesses
        ROWS_LEARNED.labels(outcome.decision.method).inc(len(added))
        VERSIONS_LEARNED.labels(outcome.decision.method).inc()
    # the appends' long polls look again now, before the resident session's copy of its
    # arrays (not on the path to the new version; the debug line says how long it took)
    ctx.announcer.announce()
    method = method_for(inputs.spec.method.name, inputs.spec)
    _keep_resident(ctx, batch, learn, outcome, version_id, method)
    phases.mark("resident")
    log.debug("model %s: resident session grown in %.3f s", model_id, phases.took["resident"])
    JOB_DURATION.labels("learn").observe(time.perf_counter() - started)
    return len(learn.task_ids), True


def _due(session: Session, model_id: int) -> list[tuple[int, int]]:
    """The model's queued learn tasks (task id, append id) if it is ready."""
    status = session.scalar(select(Model.status).where(Model.id == model_id))
    if status != ModelStatus.ready:
        return []
    rows = session.execute(
        select(LearnTask.id, LearnTask.append_id)
        .where(LearnTask.model_id == model_id, LearnTask.status == TaskStatus.queued)
        .order_by(LearnTask.id)
    ).all()
    return [(t, a) for t, a in rows]


def _opened(session: Session, ctx: JobContext, model_id: int, due: list[tuple[int, int]]) -> Learn:
    """The appends' active rows the model does not hold yet, opened: training rows to learn
    and test rows for the split (a row erased meanwhile is no longer active). One query with
    their keys, by append (it read their ids, then each split's rows by an `IN` of them)."""
    append_ids = sorted({a for _, a in due})
    dataset = session.scalars(
        select(Dataset).join(Model, Model.dataset_id == Dataset.id).where(Model.id == model_id)
    ).one()
    # the model's own row of each sample, by its primary key: NOT IN the model's rows built
    # an index of all of them first
    held = select(ModelSample.sample_id).where(
        ModelSample.model_id == model_id, ModelSample.sample_id == Sample.id
    )
    rows: list[Any] = []
    for chunk in chunked(append_ids):  # Core rows: no ORM work per row (workers/data.py)
        rows += (
            session.connection()
            .execute(
                stored_samples()
                .add_columns(Sample.split, Sample.append_id)
                .where(
                    Sample.append_id.in_(chunk),
                    Sample.status == SampleStatus.active,
                    ~held.exists(),
                )
                .order_by(Sample.id)
            )
            .all()
        )
    rows.sort(key=lambda r: r.id)  # ids ascending across the chunks too
    added, test = split_rows(session, ctx.keyring, rows, list(dataset.feature_shape))
    per_append = {a: 0 for a in append_ids}
    for r in rows:
        if r.split == "train":
            per_append[r.append_id] += 1
    return Learn(
        task_ids=[t for t, _ in due],
        append_ids=append_ids,
        added=added,
        test=test,
        per_append=per_append,
        dataset_id=dataset.id,
    )


def _with_rows(test: RetainedData, extra: Arrays, device: torch.device) -> RetainedData:
    """The test split with the appends' test rows after it, deferred: a release's metrics
    read only its head (workers/updates.py, ACCURACY_ROWS), and copying the whole split was
    a share of a learned version's time."""
    if not len(extra):
        return test
    return joined(test, _retained(extra, device))


def _retained(rows: Arrays, device: torch.device) -> RetainedData:
    """Opened rows as a method reads them, their tensors on `device`."""
    return RetainedData(
        rows.sample_ids, rows.X.to(device), rows.y.to(device), rows.subjects, rows.external_ids
    )


def commit_learned(
    session: Session,
    ctx: JobContext,
    batch: Batch,
    learn: Learn,
    outcome: Outcome | None,
    stored: blobs_of.VersionBlobs | None,
    signer: Ed25519PrivateKey,
) -> int | None:
    """The learned version, its log entry, the model's new rows and the tasks done, in the
    caller's transaction, if this worker still leases the model at the batch's version;
    None when no training row was left to learn (the tasks finish, no version)."""
    session.autoflush = False
    model = check_lease(session, batch.model_id)
    if model.current_version_id != batch.parent_id:
        raise LeaseLost(f"model {batch.model_id} moved past version {batch.parent_number}")
    version: VersionRow | None = None
    certificate_id: int | None = None
    if outcome is not None:
        assert stored is not None, "a release's blobs are stored before its commit"
        more = {"learned_from_appends": learn.append_ids}
        version = write_release(session, ctx, batch, outcome, stored, more)
        (entry,) = append_certificates(
            session, [learned_fields(batch, learn, outcome, version)], signer
        )
        certificate_id = entry.id
        events.version_published(
            session,
            batch.model_id,
            version.number,
            "learned",
            version.weights_sha256,
            [certificate_id],
        )
        # tuples in a few statements (COPY on PostgreSQL): the ORM's insert of dicts was
        # most of an append's commit
        rows = [(batch.model_id, s) for s in learn.added.sample_ids]
        insert_rows(session.connection(), MODEL_SAMPLES, ("model_id", "sample_id"), rows)
        also = supersede(session, ctx, batch, outcome, version)
        finish_requests(session, ctx.keyring, set(), also=also)
    version_id = version.id if version is not None else None
    _tasks_done(session, learn, version_id, certificate_id)
    return version_id


def _tasks_done(
    session: Session, learn: Learn, version_id: int | None, certificate_id: int | None
) -> None:
    """The learning tasks finished, each with the rows it added and the version made."""
    now = utcnow()
    for task_id, append_id in _tasks_of(session, learn.task_ids):
        session.execute(
            update(LearnTask)
            .where(LearnTask.id == task_id, LearnTask.status == TaskStatus.queued)
            .values(
                status=TaskStatus.done,
                version_id=version_id,
                certificate_id=certificate_id,
                n_added=learn.per_append.get(append_id, 0),
                finished_at=now,
            )
        )


def learned_fields(batch: Batch, learn: Learn, outcome: Outcome, version: VersionRow) -> JsonObject:
    """The learned version's entry in the log: a release like any other (its guarantee, ε, δ,
    σ, constants and the lineage fields, so later certificates compose it), of no request
    (request 0), removing nothing, naming the appends and how many rows it added."""
    ctx = CertificateContext(
        request_id=0,
        model_id=batch.model_id,
        from_version=batch.parent_number,
        to_version=version.number,
        release_sha256=version.weights_sha256,
        n_removed=0,
        n_removed_in_update=0,
        coalesced_requests=[],
        removed_ids_commitment=removed_ids_commitment(b"\0" * 32, []),
    )
    fields = certificate_fields(outcome.decision, batch.policy, batch.target(), ctx)
    return {
        **fields,
        "kind": "learned",
        "append_ids": list[JsonValue](learn.append_ids),
        "n_added": len(learn.added),
    }


def _tasks_of(session: Session, task_ids: list[int]) -> list[tuple[int, int]]:
    rows: list[tuple[int, int]] = []
    for chunk in chunked(task_ids):
        rows += session.execute(
            select(LearnTask.id, LearnTask.append_id).where(LearnTask.id.in_(chunk))
        ).all()
    return rows


def _failed(session: Session, task_ids: list[int], exc: Exception) -> None:
    """The tasks failed for good: the model stays at its version; the error names only the
    failure's type (its message could carry values of the data)."""
    session.execute(
        update(LearnTask)
        .where(LearnTask.id.in_(task_ids), LearnTask.status == TaskStatus.queued)
        .values(
            status=TaskStatus.failed,
            error=f"learning failed: {type(exc).__name__} (see the worker's log)",
            finished_at=utcnow(),
        )
    )


def _keep_resident(
    ctx: JobContext,
    batch: Batch,
    learn: Learn,
    outcome: Outcome | None,
    version_id: int | None,
    method: UnlearningMethod,
) -> None:
    """The session at the learned version, its rows and test split grown by the appends'
    (a copy of the arrays, after the commit: not on the path to the new version)."""
    if batch.session is None:
        return
    grown = replace(batch, session=batch.session.grown(learn.added, learn.test))
    where = database_key(ctx.db.engine)
    if len(learn.test):  # the session's test split is a copy of its own now
        ctx.opened.forget(where, learn.dataset_id, "test")
    keep_resident(ctx.resident_sessions(), where, grown, outcome, version_id, method)
