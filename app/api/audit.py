"""The audit log: certificates, chain verification and JSONL export."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from pydantic import AfterValidator, BeforeValidator
from sqlalchemy import select

from app.api.deps import AnyRole, Auditor, DbDep, RuntimeDep, SettingsDep
from app.api.params import PathId, QueryId
from app.api.responses import COMMON, errors
from app.core.db.tables import Certificate, Dataset, DeletionRequest
from app.core.errors import not_found
from app.core.identity import BadId, DatasetIds
from app.core.jsontypes import JsonObject, JsonValue
from app.core.ledger import transparency
from app.core.ledger.certificates import certificate_document, export_lines, verify_chain
from app.core.schemas import MAX_ID, Text
from app.core.services import subject_tokens
from app.core.storage.crypto import Keyring
from app.core.wire import CertificateOut, CertificatePage, ChainCheck

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=COMMON)

_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:?\d{2})?"
)


def _date_time_only(value: object) -> object:
    """ISO 8601 / RFC 3339 date-times only; pydantic would also read `0.5` or `1700000000`
    as Unix time, which the OpenAPI `date-time` format does not allow."""
    if isinstance(value, str) and not _DATE_TIME.fullmatch(value):
        raise ValueError("expected an ISO 8601 date-time such as 2024-01-31T12:00:00Z")
    return value


def _in_utc(value: datetime) -> datetime:
    """No offset means UTC; an offset is converted (SQLite compares the stored UTC text)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


DateTime = Annotated[datetime, BeforeValidator(_date_time_only), AfterValidator(_in_utc)]


@router.get("/certificates", response_model=CertificatePage)
def certificates(
    _: Auditor,
    db: DbDep,
    runtime: RuntimeDep,
    model: QueryId = None,
    subject: Text | None = Query(None, max_length=200),
    since: DateTime | None = Query(
        None, description="ISO 8601 date-time, e.g. 2024-01-31T12:00:00Z (no offset: UTC)"
    ),
    offset: int = Query(0, ge=0, le=2**53),
    limit: int = Query(100, ge=1, le=1000),
) -> JsonObject:
    """Certificates, newest last; filter by model, data subject, or creation time."""
    query = select(Certificate).order_by(Certificate.seq)
    if model is not None:
        query = query.where(Certificate.model_id == model)
    if since is not None:
        query = query.where(Certificate.created_at >= since)
    with db.read() as session:
        if subject is not None:
            query = query.where(
                Certificate.request_id.in_(_requests_for_subject(session, runtime.keyring, subject))
            )
        rows = session.scalars(query.offset(offset).limit(limit)).all()
        items: list[JsonValue] = [certificate_document(c, disclose=True) for c in rows]
        return {"items": items, "offset": offset, "limit": limit}


def _requests_for_subject(session: Any, ring: Keyring, subject: str) -> list[int]:
    """Requests that named this subject or removed its samples (matched by keyed token: the
    database holds no raw subject ids)."""
    by_dataset = {}
    for dataset in session.scalars(select(Dataset)):
        try:
            text = DatasetIds.of(dataset).form("subject").text(subject)
        except BadId:
            continue
        by_dataset[dataset.id] = ring.token("subject", dataset.id, text)
    tokens = set(by_dataset.values())
    sample_ids = {
        i
        for d, token in by_dataset.items()
        for i in session.scalars(subject_tokens.samples_of(d, [token]))
    }
    requests = session.execute(
        select(DeletionRequest.id, DeletionRequest.sample_ids, DeletionRequest.selector)
    ).all()
    return [
        rid
        for rid, ids, sel in requests
        if sample_ids.intersection(ids) or tokens.intersection(sel.get("subject_ids", []))
    ]


@router.get("/certificates/{certificate_id}", response_model=CertificateOut, responses=errors(404))
def certificate(certificate_id: PathId, _: Auditor, db: DbDep) -> JsonObject:
    with db.read() as session:
        cert = session.get(Certificate, certificate_id)
        if cert is None:
            raise not_found("certificate", certificate_id)
        return certificate_document(cert, disclose=True)


@router.get("/head", responses=errors(404))
def head(_: AnyRole, db: DbDep, settings: SettingsDep) -> JsonObject:
    """The latest signed tree head: Ed25519 over (tree size, root hash, timestamp), and how its
    checkpoints are witnessed (`witnesses`: how many are configured, the quorum a published
    checkpoint needs; 0 means checkpoints are published with the log's signature alone)."""
    with db.read() as session:
        latest = transparency.latest_head(session)
    witnessing: JsonObject = {
        "configured": len(settings.log_witnesses),
        "quorum": settings.witness_quorum,
        "checkpoint": "/log/checkpoint",
    }
    return {**latest, "witnesses": witnessing}


@router.get("/public-key")
def public_key(settings: SettingsDep) -> JsonObject:
    """The heads' public keys (base64 raw Ed25519), current and retired, by key id. Public:
    anyone may check a head."""
    return {
        "keys": list[JsonValue](transparency.public_keys(settings)),
        "message_format": transparency.HEAD_FORMAT,
    }


@router.get("/proof/inclusion", responses=errors(404))
def inclusion_proof(
    _: Auditor,  # the proof carries the certificate itself; requesters get theirs as receipts
    db: DbDep,
    certificate: Annotated[int, Query(ge=1, le=MAX_ID)],
    tree_size: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> JsonObject:
    """RFC 6962 inclusion proof of a certificate in the tree of `tree_size` (default: latest)."""
    with db.read() as session:
        return transparency.inclusion(session, certificate, tree_size)


@router.get("/proof/consistency")
def consistency_proof(
    _: AnyRole,
    db: DbDep,
    first: Annotated[int, Query(ge=1, le=MAX_ID)],
    second: Annotated[int, Query(ge=1, le=MAX_ID)],
) -> JsonObject:
    """RFC 6962 consistency proof: the tree of `second` extends the tree of `first`."""
    with db.read() as session:
        return transparency.consistency(session, first, second)


@router.get("/verify", response_model=ChainCheck)
def verify(_: Auditor, db: DbDep) -> JsonObject:
    """Recompute every entry hash and link; name the first certificate that does not hold."""
    with db.read(streaming=True) as session:
        return verify_chain(session)


@router.get(
    "/export",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "One JSON document per line (JSON Lines)",
            "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
        }
    },
)
def export(_: Auditor, db: DbDep) -> StreamingResponse:
    """JSONL, verifiable offline with scripts/verify_audit.py."""

    def lines():
        with db.read(streaming=True) as session:
            yield from export_lines(session)

    return StreamingResponse(lines(), media_type="application/x-ndjson")
