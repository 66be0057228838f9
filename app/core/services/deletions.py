"""Accepting deletion requests: resolve, validate, commit durably, then signal the workers."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from uuid import UUID

from sqlalchemy import (
    BindParameter,
    CompoundSelect,
    Row,
    Table,
    any_,
    bindparam,
    func,
    insert,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from app.core.db.bulk import bound_values
from app.core.db.chunks import chunked
from app.core.db.session import Database
from app.core.db.tables import (
    ApiKey,
    Base,
    Certificate,
    DeletionRequest,
    DeletionTask,
    Deployment,
    ModelSample,
    ModelVersion,
    utcnow,
)
from app.core.errors import APIError, conflict, not_found, unprocessable
from app.core.identity import DatasetIds
from app.core.ledger import transparency
from app.core.schemas import DeletionCreate
from app.core.security import Role
from app.core.services.datasets import ready_dataset, sample_ids_of
from app.core.services.suppression import entries, put_tokens, suppress
from app.core.settings import Settings
from app.core.specs import PrivacyPolicy, StoredMethod
from app.core.states import DatasetStatus, ModelStatus, RequestStatus, SampleStatus, TaskStatus
from app.core.storage.crypto import Keyring
from app.core.storage.erasure import erase_payloads
from app.core.storage.keystore import KeyTable, load_keys, new_keys, store_keys
from app.core.webhooks import events
from methods import RETRAIN, method_names

# The request path's tables: Core statements on them skip the ORM's compile, load
# and unit-of-work steps, which were most of a POST's CPU.
REQUESTS, TASKS, SAMPLES, TOKENS, RECENT_TOKENS, SUBJECTS, RECENT_SUBJECTS = (
    Base.metadata.tables[t]
    for t in (
        "deletion_requests",
        "deletion_tasks",
        "samples",
        "sample_tokens",
        "sample_tokens_recent",
        "subject_tokens",
        "subject_tokens_recent",
    )
)
MODELS, HOLDINGS, DATASETS = (
    Base.metadata.tables[t] for t in ("models", "model_samples", "datasets")
)


def fingerprint(body: DeletionCreate, names: Names) -> str:
    """What an Idempotency-Key replay must match: sha256 over the body with its ids replaced by
    their keyed tokens (over the raw ids, the stored digest gave erased ids back to
    anyone hashing candidate bodies). Without the master key no candidate can be tested."""
    return request_fingerprint(
        body.dataset_id,
        list(names.samples),
        list(names.subjects),
        body.method,
        body.epsilon,
        body.delta,
    )


def request_fingerprint(
    dataset_id: int,
    sample_tokens: list[str],
    subject_tokens: list[str],
    method: str | None,
    epsilon: float | None,
    delta: float | None,
) -> str:
    """sha256 of the canonical request over tokens (migration 0008 uses it on stored rows)."""
    doc = {
        "dataset_id": dataset_id,
        "sample_ids": sample_tokens,
        "subject_ids": subject_tokens,
        "method": method,
        "epsilon": epsilon,
        "delta": delta,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def keyed_idempotency_key(ring: Keyring, requester_key_id: int | None, header: str) -> str:
    """The stored form of an Idempotency-Key: a keyed token scoped to the API key that sent it
    (a client may put a person's id in the header; only the token is kept)."""
    return ring.token("idempotency", requester_key_id or 0, header)


@dataclass(frozen=True)
class Accepted:
    request: DeletionRequest
    tasks: list[DeletionTask] | None  # None for a replay: the stored request is the answer
    replayed: bool
    opening: bytes | None = None  # the commitment's key, for this answer only
    suppressed: list[dict[str, str]] = field(default_factory=list)  # for the restore journal

    @property
    def models(self) -> list[int]:
        """Models to signal after the commit."""
        return [t.model_id for t in self.tasks or []]


def create_deletion(
    session: Session,
    ring: Keyring,
    body: DeletionCreate,
    names: Names,
    requester_key_id: int | None,
    idempotency_key: str | None,
    sees_all_erasures: bool = False,
    suppressing: bool = True,
    trace_context: str | None = None,
) -> Accepted:
    """The request (new, or the one this Idempotency-Key created before); nothing is written
    on any error. A sample erased by another key's request is answered as unknown (404) unless
    `sees_all_erasures` (admins): erased and never-existed look alike. What it found goes on
    the suppression list unless not `suppressing` (a restore re-applying journaled erasures by
    token puts the journal's suppressions back itself). `trace_context`: the POST's
    traceparent, which the worker's spans continue (app/core/tracing.py)."""
    if idempotency_key:
        # Scoped to the API key that sent it (another client's never collides), and keyed.
        idempotency_key = keyed_idempotency_key(ring, requester_key_id, idempotency_key)
        replay = _replay(session, ring, body, names, idempotency_key)
        if replay is not None:
            return replay
    if not body.sample_ids and not body.subject_ids:
        ready_dataset(session, body.dataset_id)  # 404 or 409 before this 422
        raise unprocessable("empty_selector", "give sample_ids or subject_ids")
    samples = _resolve(session, body, names, None if sees_all_erasures else requester_key_id or 0)
    erased, pending = _erased_and_pending(samples, names)
    affected = _affected_models(session, [s.id for s in pending])
    _check_models(affected, body)

    now = utcnow()
    postgres = session.get_bind().dialect.name == "postgresql"
    opening, commitment_key_id, key = None, None, None
    if pending and affected:  # certificates will be written: they commit under this key
        opening, commitment_key_id, key = _commitment_key(session, ring, postgres)
    row: dict[str, Any] = {
        **_asked(body, names, idempotency_key, requester_key_id),
        "sample_ids": sorted(s.id for s in pending),
        "already_erased": _erased_report(session, erased),
        "status": RequestStatus.queued if affected else RequestStatus.done,
        "error": None,
        "commitment_key_id": commitment_key_id,
        "trace_context": trace_context,
        "created_at": now,
        "updated_at": now,
        "finished_at": None if affected else now,
    }
    # Core statements (see REQUESTS); the request and its tasks are transient objects made
    # from the rows written, for the answer.
    task = {"status": TaskStatus.queued, "attempts": 0, "n_removed": 0}
    task |= {"created_at": now, "updated_at": now}
    models, marked = [m.id for m in affected], [s.id for s in pending]
    if postgres:  # one statement
        request_id = _accept_at_once(session, key, row, task, models, marked)
    else:
        request_id = _accept_in_steps(session, row, task, models, marked)
    request = DeletionRequest(id=request_id, **row)
    matched = partial(_suppress_matched, session, ring, names, body.dataset_id, samples)
    suppressed = matched(request_id) if suppressing else []
    if not affected:
        erase_payloads(session, ring, [s.id for s in pending])
        events.deletion_completed(session, [request_id])  # done as accepted
    tasks = [DeletionTask(**t) for t in _task_rows(task, request_id, models)]
    return Accepted(request, tasks, replayed=False, opening=opening, suppressed=suppressed)


def _asked(
    body: DeletionCreate, names: Names, idempotency_key: str | None, requester_key_id: int | None
) -> dict[str, Any]:
    """The request row's record of what was asked, and by whom (tokens, never raw ids)."""
    return {
        "dataset_id": body.dataset_id,
        "idempotency_key": idempotency_key,
        "fingerprint": fingerprint(body, names),
        "requester_key_id": requester_key_id,
        "selector": names.selector(),
        "method": body.method,
        "epsilon": body.epsilon,
        "delta": body.delta,
    }


def _erased_and_pending(
    samples: list[SampleRef], names: Names
) -> tuple[list[SampleRef], list[SampleRef]]:
    """The samples erased before (in the body's order, for the report) and those to erase."""
    order = {token: i for i, token in enumerate(names.samples)}
    erased = sorted(
        (s for s in samples if s.status == SampleStatus.erased),
        key=lambda s: (order.get(s.external_id, len(order)), s.id),
    )
    return erased, [s for s in samples if s.status != SampleStatus.erased]


def _replay(
    session: Session, ring: Keyring, body: DeletionCreate, names: Names, idempotency_key: str
) -> Accepted | None:
    """The request this (keyed) Idempotency-Key made before, if any: the same body replays
    it; another is 422 `idempotency_key_reused`."""
    existing = session.scalar(
        select(DeletionRequest).where(DeletionRequest.idempotency_key == idempotency_key)
    )
    if existing is None:
        return None
    if existing.fingerprint != fingerprint(body, names):
        raise unprocessable(
            "idempotency_key_reused",
            "this Idempotency-Key was used with a different body",
            {"request_id": existing.id},
        )
    return Accepted(existing, None, replayed=True, opening=_opening(session, ring, existing))


def _commitment_key(
    session: Session, ring: Keyring, postgres: bool
) -> tuple[bytes, UUID, dict[str, Any]]:
    """A fresh key the request's certificates commit to its removed ids under: its opening,
    its id and its wrapped row (PostgreSQL inserts it with the request, in one statement)."""
    ((key_id, opening, wrapped),) = fresh = new_keys(ring, 1)
    if not postgres:
        store_keys(session.connection(), ring, fresh, KeyTable.short)
    return opening, key_id, {"id": key_id, "wrapped": wrapped, "kek_id": ring.kek_id}


def _accept_in_steps(
    session: Session,
    row: dict[str, Any],
    task: dict[str, Any],
    models: list[int],
    marked: list[int],
) -> int:
    """The request, its tasks and its samples marked erasing, a statement each (SQLite)."""
    request_id: int = session.execute(INSERT_REQUEST, row).scalar_one()
    if models:
        session.execute(insert(TASKS), _task_rows(task, request_id, models))
    for chunk in chunked(marked):
        session.execute(MARK_ERASING, {"ids": chunk})
    return request_id


def _task_rows(task: dict[str, Any], request_id: int, models: list[int]) -> list[dict[str, Any]]:
    return [{**task, "request_id": request_id, "model_id": m} for m in models]


def _accept_at_once(
    session: Session,
    key: dict[str, Any] | None,
    request: dict[str, Any],
    task: dict[str, Any],
    models: list[int],
    marked: list[int],
) -> int:
    """PostgreSQL: the commitment key, the request, its tasks (one per model of `models`, each
    `task`) and the `marked` samples' move to erasing, in one statement (data-modifying CTEs;
    three round trips less on every POST). Returns the request's id."""
    shape = (key is not None, bool(models), bool(marked))
    statement = _ACCEPT.get(shape)
    if statement is None:
        statement = _ACCEPT[shape] = _accept_statement(*shape, tuple(request), tuple(task))
    params: dict[str, Any] = {f"r_{c}": v for c, v in request.items()}
    params |= {f"k_{c}": v for c, v in (key or {}).items()}
    params |= {f"t_{c}": v for c, v in task.items()}
    params |= {"t_models": models, "m_ids": marked}
    params |= {"m_active": SampleStatus.active, "m_erasing": SampleStatus.erasing}
    return int(session.execute(statement, params).scalar_one())


_ACCEPT: dict[tuple[bool, bool, bool], Any] = {}  # shape -> statement (_accept_at_once)


def _accept_statement(
    key: bool, tasks: bool, marks: bool, request: tuple[str, ...], task: tuple[str, ...]
) -> Any:
    """The statement of `_accept_at_once` for one shape (parameters prefixed, `bound_values`)."""
    values = bound_values(REQUESTS, "r_", request)
    made = insert(REQUESTS).values(values).returning(REQUESTS.c.id).cte("request")
    ctes = []
    if key:
        short = Base.metadata.tables[KeyTable.short]
        ctes.append(
            insert(short).values(bound_values(short, "k_", ("id", "wrapped", "kek_id"))).cte("key")
        )
    if tasks:
        columns = bound_values(TASKS, "t_", task)
        models = func.unnest(bindparam("t_models", type_=ARRAY(TASKS.c.model_id.type)))
        chosen = select(made.c.id, models, *columns.values())
        names = ["request_id", "model_id", *columns]
        ctes.append(insert(TASKS).from_select(names, chosen).cte("tasks"))
    if marks:
        ids = bindparam("m_ids", type_=ARRAY(SAMPLES.c.id.type))
        ctes.append(
            update(SAMPLES)
            .where(SAMPLES.c.id == any_(ids), SAMPLES.c.status == bindparam("m_active"))
            .values(status=bindparam("m_erasing"))
            .cte("marked")
        )
    return select(made.c.id).add_cte(*ctes)


def _opening(session: Session, ring: Keyring, request: DeletionRequest) -> bytes | None:
    """The request's opening while the server still keeps it (until the request finishes)."""
    if request.commitment_key_id is None:
        return None
    key_id = request.commitment_key_id
    return load_keys(session, ring, [key_id], KeyTable.short).get(key_id)


def _suppress_matched(
    session: Session,
    ring: Keyring,
    names: Names,
    dataset_id: int,
    samples: Sequence[Any],
    request_id: int,
) -> list[dict[str, Any]]:
    """Every sample id this request erases and every subject it named go on the suppression
    list: a later registration or append refuses their rows. A person's rows matched by
    subject put their sample ids there too, read from their sealed records (the next export
    may name the same rows without the subject). Sample ids only where they are the client's
    own (not row numbers, which name nobody from one dataset to the next)."""
    dataset = session.execute(select(DATASETS).where(DATASETS.c.id == dataset_id)).one()
    rules = DatasetIds.of(dataset)
    subject_texts = {
        s.subject_id: names.texts.get(s.subject_id, names.subjects[s.subject_id])
        for s in samples
        if s.subject_id in names.subjects
    }
    made = suppress(session, ring, "subject", list(subject_texts.values()), request_id, rules)
    if not dataset.ids_given:
        return made
    named = [s for s in samples if s.external_id in names.samples]
    texts = [names.texts.get(s.external_id, names.samples[s.external_id]) for s in named]
    made += suppress(session, ring, "sample", texts, request_id, rules)
    by_subject: dict[str, list[int]] = {}
    for s in samples:
        if s.external_id not in names.samples and s.subject_id in subject_texts:
            by_subject.setdefault(s.subject_id, []).append(s.id)
    for subject, ids in by_subject.items():
        via = entries(ring, "subject", [subject_texts[subject]], rules)[0].token
        found = sample_ids_of(session, ring, ids)
        made += suppress(session, ring, "sample", found, request_id, rules, via)
    return made


@dataclass(frozen=True)
class Names:
    """The raw ids of one request body and their keyed tokens: only tokens are stored, so a
    request row never keeps a person's identifiers (DESIGN §6). Each id is read in its
    dataset's form (app/core/identity.py) before it is tokened."""

    samples: dict[str, str]  # token -> raw id, in the body's order
    subjects: dict[str, str]
    texts: dict[str, str] = field(default_factory=dict)  # token -> canonical text

    @classmethod
    def of(cls, body: DeletionCreate, ring: Keyring, rules: DatasetIds = DatasetIds()) -> Names:
        """422 naming the first id with no canonical form (its position, not its value)."""
        sample_ids = list(dict.fromkeys(body.sample_ids))
        subject_ids = list(dict.fromkeys(body.subject_ids))
        sample_texts = rules.form("sample").texts(sample_ids, "sample_ids")
        subject_texts = rules.form("subject").texts(subject_ids, "subject_ids")
        sample_tokens = ring.tokens("sample", body.dataset_id, sample_texts)
        subject_tokens = ring.tokens("subject", body.dataset_id, subject_texts)
        return cls(
            dict(zip(sample_tokens, sample_ids, strict=True)),
            dict(zip(subject_tokens, subject_ids, strict=True)),
            dict(zip(sample_tokens + subject_tokens, sample_texts + subject_texts, strict=True)),
        )

    def selector(self) -> dict[str, list[str]]:
        return {"sample_ids": list(self.samples), "subject_ids": list(self.subjects)}

    def name(self, token: str) -> str:
        """The raw id the client sent for `token` (it knows it), else the token itself."""
        return self.samples.get(token) or self.subjects.get(token) or token


# The columns a request needs of a sample (not its sealed payload): rows, not ORM objects,
# on the request path.
SAMPLE_REF = (SAMPLES.c.id, SAMPLES.c.external_id, SAMPLES.c.subject_id, SAMPLES.c.status)
MODEL_REF = (MODELS.c.id, MODELS.c.status, MODELS.c.method, MODELS.c.privacy)
ModelRef = Row[int, ModelStatus, StoredMethod, PrivacyPolicy]  # what MODEL_REF selects

# Built once with expanding parameters: building a statement and its cache key on every POST
# cost more CPU than running it.
_IDS: BindParameter[list[Any]] = bindparam("ids", expanding=True)
_DATASET: BindParameter[int] = bindparam("dataset_id")
# A registering dataset's samples are not found (its 404 path answers 409 instead): no extra
# statement on the request path for it.
_READY = (
    select(DATASETS.c.id)
    .where(DATASETS.c.id == _DATASET, DATASETS.c.status == DatasetStatus.ready)
    .exists()
)


def _samples_by_token(tables: tuple[Table, ...]) -> CompoundSelect:
    """The dataset's ready samples whose tokens in these tables (a main table and its recent
    one, app/core/services/token_merge.py) are among `ids`."""
    return union_all(
        *(
            select(*SAMPLE_REF)
            .join(t, t.c.sample_id == SAMPLES.c.id)
            .where(t.c.dataset_id == _DATASET, t.c.token.in_(_IDS), _READY)
            for t in tables
        )
    )


SAMPLES_NAMED = _samples_by_token((TOKENS, RECENT_TOKENS))
SAMPLES_OF_SUBJECTS = _samples_by_token((SUBJECTS, RECENT_SUBJECTS))
MODELS_HOLDING = select(*MODEL_REF).where(
    MODELS.c.id.in_(
        select(HOLDINGS.c.model_id)
        .where(HOLDINGS.c.sample_id.in_(_IDS), HOLDINGS.c.removed_version_id.is_(None))
        .distinct()
    ),
    MODELS.c.status != ModelStatus.failed,
)
INSERT_REQUEST = insert(REQUESTS).returning(REQUESTS.c.id)
MARK_ERASING = (
    update(SAMPLES)
    .where(SAMPLES.c.id.in_(_IDS), SAMPLES.c.status == SampleStatus.active)
    .values(status=SampleStatus.erasing)
)


SampleRef = Row[int, str, str | None, str]


def _resolve(
    session: Session, body: DeletionCreate, names: Names, viewer_key_id: int | None
) -> list[SampleRef]:
    """The samples the body names; 404 naming the unknown ids. With `viewer_key_id`, a sample
    erased by a request that key did not send counts as unknown: otherwise a guessed id or
    subject would tell "erased by someone" (202, already_erased) from "never existed" (404)."""
    found: dict[int, SampleRef] = {}
    by_sample: dict[int, str] = {}  # sample id -> the sample token that named it
    for chunk in chunked(list(names.samples)):
        for s in session.execute(SAMPLES_NAMED, {"dataset_id": body.dataset_id, "ids": chunk}):
            found[s.id] = s
            by_sample[s.id] = s.external_id
    for chunk in chunked(list(names.subjects)):
        for s in session.execute(
            SAMPLES_OF_SUBJECTS, {"dataset_id": body.dataset_id, "ids": chunk}
        ):
            found[s.id] = s
    if viewer_key_id is not None:
        hidden = _erased_by_others(session, body.dataset_id, viewer_key_id, list(found.values()))
        found = {i: s for i, s in found.items() if i not in hidden}
    known = {by_sample[i] for i in found if i in by_sample}
    seen_subjects = {s.subject_id for s in found.values() if s.subject_id is not None}
    unknown = [raw for token, raw in names.samples.items() if token not in known]
    unknown_subjects = [raw for token, raw in names.subjects.items() if token not in seen_subjects]
    if unknown or unknown_subjects:
        ready_dataset(session, body.dataset_id)  # no such dataset (404), or registering (409)
        n = len(unknown) + len(unknown_subjects)
        raise APIError(
            404,
            "sample_not_found",
            f"{n} unknown sample or subject id(s) in dataset {body.dataset_id}; nothing was queued",
            {
                "unknown_sample_ids": unknown[:1000],
                "unknown_subject_ids": unknown_subjects[:1000],
                "n_unknown": n,
            },
        )
    return list(found.values())


def _erased_by_others(
    session: Session, dataset_id: int, key_id: int, samples: list[SampleRef]
) -> set[int]:
    """Those of these samples that are erased and that no request of this key asked for."""
    erased = {s.id for s in samples if s.status == SampleStatus.erased}
    if not erased:
        return set()
    mine: set[int] = set()
    for (ids,) in session.execute(
        select(DeletionRequest.sample_ids).where(
            DeletionRequest.dataset_id == dataset_id,
            DeletionRequest.requester_key_id == key_id,
        )
    ):
        mine.update(int(i) for i in ids if int(i) in erased)
    return erased - mine


def _affected_models(session: Session, sample_ids: list[int]) -> list[ModelRef]:
    """Models (not failed) still holding any of these samples: one query per chunk of ids
    (one round trip for a request of up to a chunk of samples)."""
    found: dict[int, ModelRef] = {}
    for chunk in chunked(sample_ids):
        for m in session.execute(MODELS_HOLDING, {"ids": chunk}):
            found[m.id] = m
    return [found[i] for i in sorted(found)]


def _check_models(models: list[ModelRef], body: DeletionCreate) -> None:
    busy = [m.id for m in models if m.status in (ModelStatus.queued, ModelStatus.training)]
    if busy:
        raise conflict(
            "model_training",
            "a model trained on these samples is still training; retry when it is ready",
            {"model_ids": busy},
        )
    if body.method is not None and body.method not in method_names():
        raise unprocessable("unknown_method", f"unknown method {body.method!r}")
    for m in models:
        if body.method not in (None, RETRAIN, m.method.name):
            raise unprocessable(
                "method_not_configured",
                f"model {m.id} is configured for {m.method.name!r}",
                {"model_id": m.id},
            )
        policy = m.privacy
        if body.epsilon is not None and body.epsilon > policy.epsilon:
            raise unprocessable(
                "target_looser_than_policy",
                f"ε={body.epsilon} exceeds model {m.id}'s policy ε={policy.epsilon}",
                {"model_id": m.id},
            )
        if body.delta is not None and body.delta > policy.delta:
            raise unprocessable(
                "target_looser_than_policy",
                f"δ={body.delta} exceeds model {m.id}'s policy δ={policy.delta}",
                {"model_id": m.id},
            )


def _erased_report(session: Session, erased: list[SampleRef]) -> list[dict[str, Any]]:
    report = []
    for s in erased:
        certs = session.scalars(
            select(ModelSample.removed_certificate_id).where(
                ModelSample.sample_id == s.id, ModelSample.removed_certificate_id.is_not(None)
            )
        ).all()
        ids = sorted({c for c in certs if c is not None})
        report.append({"sample_id": s.external_id, "certificate_ids": ids})
    return report


def list_deletions(
    session: Session, viewer: ApiKey, offset: int, limit: int
) -> list[dict[str, Any]]:
    """Requests, newest first: a requester's own, or every request for auditors and admins."""
    query = select(DeletionRequest).order_by(DeletionRequest.id.desc())
    if viewer.role == Role.requester:
        query = query.where(DeletionRequest.requester_key_id == viewer.id)
    rows = session.scalars(query.offset(offset).limit(limit)).all()
    return [deletion_view(session, r) for r in rows]


def get_deletion(
    session: Session, request_id: int, viewer: ApiKey | None = None
) -> DeletionRequest:
    """The request, if `viewer` may see it: a requester sees only what its own key sent."""
    request = session.get(DeletionRequest, request_id)
    if request is None or (
        viewer is not None
        and viewer.role == Role.requester
        and request.requester_key_id != viewer.id
    ):
        raise not_found("deletion", request_id)
    return request


def deletion_view(
    session: Session,
    request: DeletionRequest,
    names: Names | None = None,
    new_tasks: list[DeletionTask] | None = None,
    receipts: bool = False,
    opening: bytes | None = None,
) -> dict[str, Any]:
    """Status, per-model progress and certificates of one request. Ids show as the stored
    tokens, except to the client that just sent them (`names`, from its own body). The tasks
    of a request created in this session are passed in (`new_tasks`, no version yet): one
    query less on the request path. `receipts` adds the Merkle receipts of a
    finished request (the single-request read; lists leave them out: O(log² n) each)."""
    name = names.name if names is not None else (lambda token: token)
    models = [
        {
            "model_id": t.model_id,
            "status": t.status,
            "version": number,
            "certificate_id": t.certificate_id,
            "n_removed": t.n_removed,
            "error": t.error,
        }
        for t, number in _tasks_with_versions(session, request, new_tasks)
    ]
    return {
        "id": request.id,
        "status": request.status,
        "dataset_id": request.dataset_id,
        "selector": {kind: [name(t) for t in tokens] for kind, tokens in request.selector.items()},
        "n_samples": len(request.sample_ids),
        "already_erased": [
            {**entry, "sample_id": name(entry["sample_id"])} for entry in request.already_erased
        ],
        "models": models,
        "certificate_ids": sorted(
            {m["certificate_id"] for m in models if m["certificate_id"] is not None}
        ),
        "receipts": _receipts(session, request, models) if receipts else [],
        "opening": opening.hex() if opening is not None else None,
        "error": request.error,
        "created_at": request.created_at,
        "finished_at": request.finished_at,
    }


def _tasks_with_versions(
    session: Session, request: DeletionRequest, new_tasks: list[DeletionTask] | None
) -> list[tuple[DeletionTask, int | None]]:
    """The request's tasks by model, each with the number of the version it made."""
    if new_tasks is not None:  # made in this session: no version yet, no query
        return [(t, None) for t in sorted(new_tasks, key=lambda t: t.model_id)]
    found = session.execute(
        select(DeletionTask, ModelVersion.number)
        .outerjoin(ModelVersion, ModelVersion.id == DeletionTask.version_id)
        .where(DeletionTask.request_id == request.id)
        .order_by(DeletionTask.model_id)
    )
    return [(t, number) for t, number in found]


def _receipts(
    session: Session, request: DeletionRequest, models: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Once done: per new certificate, the signed tree head that first includes it and the
    inclusion proof at that size, for the requester to keep."""
    if request.status != RequestStatus.done:
        return []
    mine = sorted({m["certificate_id"] for m in models if m["certificate_id"] and m["version"]})
    return [transparency.receipt(session, c) for c in mine]


def tlog_proof_of(
    db: Database, settings: Settings, request_id: int, certificate_id: int, viewer: ApiKey
) -> str:
    """A certificate of this request as a C2SP `.tlog-proof` under the newest published
    checkpoint (witness-cosigned when witnesses are configured); 409 until one includes it."""
    from app.core.ledger.publish import current_checkpoint
    from app.core.ledger.tiles import tlog_proof

    with db.read() as session:
        request = get_deletion(session, request_id, viewer)
        mine = session.scalars(
            select(DeletionTask.certificate_id).where(DeletionTask.request_id == request.id)
        ).all()
        if certificate_id not in mine:
            raise not_found("certificate", certificate_id, request_id=request_id)
        cert = session.get(Certificate, certificate_id)
        assert cert is not None
    published = current_checkpoint(db, settings)
    if published is None or published.tree_size < cert.seq:
        raise APIError(
            409,
            "not_yet_published",
            "no published checkpoint includes this certificate yet (its witnesses have not "
            "cosigned one); retry shortly",
            headers={"Retry-After": "2"},
        )
    with db.read() as session:
        cert = session.get(Certificate, certificate_id)
        assert cert is not None
        return tlog_proof(session, cert, published.note)


def backfill_suppressions(db: Database, ring: Keyring) -> int:
    """The sample ids of rows accepted for erasure and not yet erased, on the suppression
    list (a subject's erasure before its sample ids went there too): their records still
    open. Rows erased already cannot be: their ids are gone with their keys, and a token of
    the list cannot be made without the id. A lifted token stays lifted. Once per database
    (marked on its deployment row): erasures accepted since list their rows themselves, and
    the look for such rows reads the whole samples table. Returns how many rows were read."""
    with db.write() as session:
        deployment = session.get(Deployment, 1)
        if deployment is not None and deployment.suppressions_backfilled:
            return 0
        pending = session.execute(
            select(SAMPLES.c.id, SAMPLES.c.dataset_id)
            .join(DATASETS, DATASETS.c.id == SAMPLES.c.dataset_id)
            .where(SAMPLES.c.status == SampleStatus.erasing, DATASETS.c.ids_given.is_(True))
        ).all()
        by_dataset: dict[int, list[int]] = {}
        for sample_id, dataset_id in pending:
            by_dataset.setdefault(dataset_id, []).append(sample_id)
        for dataset_id, ids in by_dataset.items():
            rules = DatasetIds.of(
                session.execute(select(DATASETS).where(DATASETS.c.id == dataset_id)).one()
            )
            texts = sample_ids_of(session, ring, ids)
            put_tokens(session, entries(ring, "sample", texts, rules), None, relist=False)
        if deployment is not None:
            deployment.suppressions_backfilled = True
    return len(pending)
