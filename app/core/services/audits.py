"""Privacy audits: record one for the worker, read them back."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db.tables import PrivacyAudit, Sample
from app.core.errors import conflict, not_found, unprocessable
from app.core.schemas import AuditCreate
from app.core.services.models import get_model
from app.core.specs import architecture_of
from app.core.states import AuditStatus, ModelStatus, SampleStatus
from app.core.wire import AuditOut
from architectures import kind_of
from methods import get_method

OPEN = (AuditStatus.queued, AuditStatus.running)


def create_audit(
    session: Session, model_id: int, spec: AuditCreate, requester_key_id: int | None
) -> PrivacyAudit:
    """Queue an audit of a ready classifier; one open audit per model at a time."""
    model = get_model(session, model_id)
    if model.status != ModelStatus.ready or model.current_version_id is None:
        raise conflict("model_not_ready", f"model {model_id} has no released version to audit")
    if not kind_of(model.architecture).classifier:
        raise unprocessable(
            "not_auditable", "a topic model has no labels: canaries with labels do not apply"
        )
    if spec.kind == "leverage" and architecture_of(model.architecture).type != "logreg":
        raise unprocessable(
            "not_linear",
            "leverage canaries are for linear models (logreg): a network's features are "
            "learned, so the data's least-varied input directions say nothing of its leverage",
        )
    if spec.score == "weights" and get_method(model.method.name).aggregation is not None:
        raise unprocessable(
            "not_one_network",
            "the weights score compares one network with a reference; a sharded ensemble "
            "releases several: use score 'loss' or 'margin'",
        )
    if spec.kind == "mislabelled":
        rows = session.scalar(
            select(func.count()).where(
                Sample.dataset_id == model.dataset_id,
                Sample.split.in_(("test", "train")),
                Sample.status == SampleStatus.active,
            )
        )
        if (rows or 0) < spec.canaries:
            raise unprocessable(
                "too_few_rows",
                f"mislabelled canaries are test-split rows, then training rows, each given a "
                f"wrong label; the dataset has {rows} rows: ask for at most that many canaries "
                "or use kind 'random'",
            )
    busy = session.scalar(
        select(PrivacyAudit.id).where(
            PrivacyAudit.model_id == model_id, PrivacyAudit.status.in_(OPEN)
        )
    )
    if busy is not None:
        raise conflict("audit_running", f"audit {busy} of model {model_id} is still running")
    audit = PrivacyAudit(
        model_id=model_id, options=spec.model_dump(), requester_key_id=requester_key_id
    )
    session.add(audit)
    session.flush()
    return audit


def get_audit(session: Session, audit_id: int) -> PrivacyAudit:
    audit = session.get(PrivacyAudit, audit_id)
    if audit is None:
        raise not_found("audit", audit_id)
    return audit


def list_audits(session: Session, model_id: int) -> list[PrivacyAudit]:
    get_model(session, model_id)
    return list(
        session.scalars(
            select(PrivacyAudit)
            .where(PrivacyAudit.model_id == model_id)
            .order_by(PrivacyAudit.id.desc())
        )
    )


def audit_view(audit: PrivacyAudit) -> AuditOut:
    out = AuditOut.model_validate(audit)
    verdict = (audit.result or {}).get("verdict")
    return out.model_copy(update={"verdict": verdict if isinstance(verdict, str) else None})
