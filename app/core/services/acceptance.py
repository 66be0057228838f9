"""Accepting a deletion request: its ids tokened, the request committed in the next group
commit, the workers of its models signalled, and the restore journal written, all before the
requester is answered (durable before acknowledged; docs/deletions.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from sqlalchemy.orm import Session

from app.core import tracing
from app.core.db.group_commit import GroupCommitter
from app.core.db.session import Database
from app.core.db.tables import ApiKey, Dataset
from app.core.dispatch import DELETE, Dispatcher
from app.core.identity import DatasetIds
from app.core.runtime import Runtime
from app.core.schemas import DeletionCreate, DeletionOut
from app.core.security import Role
from app.core.services.deletions import Names, create_deletion, deletion_view
from app.core.storage.erasure import compact_after_erasure


@dataclass(frozen=True)
class Acknowledged:
    """What the requester is answered: the request, whether it was a replay of one accepted
    before (the same `Idempotency-Key`), and its ids with their tokens (for its views)."""

    view: DeletionOut
    replayed: bool
    names: Names


@dataclass(frozen=True)
class Committed:
    """What one request's transaction hands on: the answer, the models to signal, the samples
    it marked and the suppression tokens it wrote (the journal keeps both)."""

    view: DeletionOut
    replayed: bool
    models: list[int]
    samples: list[int]
    suppressed: list[dict[str, str]]


def dataset_rules(db: Database, dataset_id: int) -> DatasetIds:
    """The dataset's rules for ids (the defaults for an unknown one, which answers 404): read
    before the tokens are made, outside the request's transaction."""
    with db.read() as session:
        found = session.get(Dataset, dataset_id)
        return DatasetIds() if found is None else DatasetIds.of(found)


def accept(
    runtime: Runtime,
    committer: GroupCommitter,
    dispatcher: Dispatcher,
    body: DeletionCreate,
    requester: ApiKey,
    idempotency_key: str | None,
) -> Acknowledged:
    """Accept one request; the steps' spans tile its path (app/core/tracing.py)."""
    arrived = tracing.request_started_ns()  # its routing, key check and schema validation
    names = Names.of(body, runtime.keyring, dataset_rules(runtime.db, body.dataset_id))
    tracing.record("deletion.validate", arrived, None)
    unit = partial(_commit, runtime, body, names, requester, idempotency_key, tracing.carrier())
    submitted = time.time_ns()
    done = committer.submit(unit, after=partial(_signal, dispatcher))
    # until its group's transaction wrote it: the worker's queue wait starts there
    tracing.record(
        "deletion.group_commit", submitted, None if done.replayed else done.view.created_at
    )
    if not done.replayed:  # durable apart from the database before it is acknowledged
        with tracing.span("deletion.journal"):
            runtime.journal.record_request(
                done.view.id,
                body.dataset_id,
                done.samples,
                list(names.samples),
                list(names.subjects),
                done.suppressed,
            )
    if done.view.status == "done" and not done.replayed:  # nothing held them: erased now
        compact_after_erasure(runtime.db, runtime.settings)
    return Acknowledged(done.view, done.replayed, names)


def _commit(
    runtime: Runtime,
    body: DeletionCreate,
    names: Names,
    requester: ApiKey,
    idempotency_key: str | None,
    traceparent: str | None,
    session: Session,
) -> Committed:
    accepted = create_deletion(
        session,
        runtime.keyring,
        body,
        names,
        requester.id,
        idempotency_key,
        requester.role == Role.admin,
        trace_context=traceparent,
    )
    view = deletion_view(
        session, accepted.request, names, new_tasks=accepted.tasks, opening=accepted.opening
    )
    return Committed(
        DeletionOut.model_validate(view),
        accepted.replayed,
        accepted.models,
        list(accepted.request.sample_ids),
        accepted.suppressed,
    )


def _signal(dispatcher: Dispatcher, done: Committed) -> None:
    """Wake each affected model's worker, once the commit is durable."""
    for model_id in done.models:
        dispatcher.enqueue(DELETE, model_id)
