"""Privacy audits: an admin or auditor asks for one (202, a job with its stage),
anyone with a key reads it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body

from app.api.deps import AnyRole, Auditor, DbDep, DispatcherDep
from app.api.params import PathId
from app.api.responses import COMMON, errors
from app.core.dispatch import AUDIT
from app.core.jsontypes import JsonObject
from app.core.schemas import AuditCreate
from app.core.services.audits import audit_view, create_audit, get_audit, list_audits
from app.core.wire import AuditOut

router = APIRouter(tags=["audits"], responses=COMMON)

AUDIT_EXAMPLES: JsonObject = {
    "default": {"summary": "1,000 random canaries, scored by loss", "value": {}},
    "margin": {
        "summary": "mislabelled test rows, scored by logit margin, repeatable",
        "value": {"canaries": 300, "kind": "mislabelled", "score": "margin", "seed": 7},
    },
}


@router.post(
    "/v1/models/{model_id:int}/audits",
    status_code=202,
    response_model=AuditOut,
    responses=errors(404, 409, 422),
)
def start(
    model_id: PathId,
    spec: Annotated[AuditCreate, Body(openapi_examples=AUDIT_EXAMPLES)],
    key: Auditor,
    db: DbDep,
    dispatcher: DispatcherDep,
) -> AuditOut:
    """Audit the model's certificates with canaries: a shadow of its recipe trained on its
    retained rows plus m canaries, each included-then-removed through its own method or never
    included, scored by the release; the one-run and f-DP lower bounds on ε per canary are
    compared with what the certificate implies. Poll GET /v1/audits/{id}."""
    with db.write() as session:
        audit = create_audit(session, model_id, spec, key.id)
        view = audit_view(audit)
    dispatcher.enqueue(AUDIT, view.id)
    return view


@router.get("/v1/audits/{audit_id:int}", response_model=AuditOut, responses=errors(404))
def read(audit_id: PathId, _: AnyRole, db: DbDep) -> AuditOut:
    """One audit: its stage while it runs, its result and verdict once done."""
    with db.read() as session:
        return audit_view(get_audit(session, audit_id))


@router.get(
    "/v1/models/{model_id:int}/audits", response_model=list[AuditOut], responses=errors(404)
)
def for_model(model_id: PathId, _: AnyRole, db: DbDep) -> list[AuditOut]:
    """A model's audits, newest first."""
    with db.read() as session:
        return [audit_view(a) for a in list_audits(session, model_id)]
