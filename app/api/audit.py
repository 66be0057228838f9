"""The audit log: certificates, chain verification and JSONL export."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from sqlalchemy import select

from app.api.deps import Auditor, DbDep
from app.audit import certificate_document, export_lines, verify_chain
from app.db.tables import Certificate, DeletionRequest, Sample
from app.errors import not_found

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get("/certificates")
def certificates(
    _: Auditor,
    db: DbDep,
    model: int | None = None,
    subject: str | None = Query(None, max_length=200),
    since: datetime | None = None,
    offset: int = Query(0, ge=0, le=2**53),
    limit: int = Query(100, ge=1, le=1000),
) -> dict[str, Any]:
    """Certificates, newest last; filter by model, data subject, or creation time."""
    query = select(Certificate).order_by(Certificate.seq)
    if model is not None:
        query = query.where(Certificate.model_id == model)
    if since is not None:
        query = query.where(Certificate.created_at >= since)
    with db.read() as session:
        if subject is not None:
            query = query.where(Certificate.request_id.in_(_requests_for_subject(session, subject)))
        rows = session.scalars(query.offset(offset).limit(limit)).all()
        return {"items": [certificate_document(c) for c in rows], "offset": offset, "limit": limit}


def _requests_for_subject(session: Any, subject: str) -> list[int]:
    sample_ids = set(session.scalars(select(Sample.id).where(Sample.subject_id == subject)))
    requests = session.execute(
        select(DeletionRequest.id, DeletionRequest.sample_ids, DeletionRequest.selector)
    ).all()
    return [
        rid
        for rid, ids, sel in requests
        if sample_ids.intersection(ids) or subject in sel.get("subject_ids", [])
    ]


@router.get("/certificates/{certificate_id}")
def certificate(certificate_id: int, _: Auditor, db: DbDep) -> dict[str, Any]:
    with db.read() as session:
        cert = session.get(Certificate, certificate_id)
        if cert is None:
            raise not_found("certificate", certificate_id)
        return certificate_document(cert)


@router.get("/verify")
def verify(_: Auditor, db: DbDep) -> dict[str, Any]:
    """Recompute every entry hash and link; name the first certificate that does not hold."""
    with db.read() as session:
        return verify_chain(session)


@router.get("/export")
def export(_: Auditor, db: DbDep) -> StreamingResponse:
    """JSONL, verifiable offline with scripts/verify_audit.py."""

    def lines():
        with db.read() as session:
            yield from export_lines(session)

    return StreamingResponse(lines(), media_type="application/x-ndjson")
