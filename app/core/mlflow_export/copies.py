"""Every version's MLflow copy, as the integrations page lists them, and a retry now: an
admin need not wait out a back-off once MLflow is back (registering again makes nothing
twice: registry.py finds a version by its tag)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.db.tables import MlflowExport, ModelVersion, utcnow
from app.core.errors import conflict, not_found
from app.core.mlflow_export.views import export_view
from app.core.states import ExportStatus


def list_copies(
    session: Session, status: ExportStatus | None = None, limit: int = 200
) -> list[dict[str, Any]]:
    """The newest copies first, each with its model, version number and next attempt."""
    query = (
        select(MlflowExport, ModelVersion.number)
        .join(ModelVersion, ModelVersion.id == MlflowExport.version_id)
        .order_by(MlflowExport.version_id.desc())
        .limit(limit)
    )
    if status is not None:
        query = query.where(MlflowExport.status == status)
    return [_row(copy, number) for copy, number in session.execute(query).all()]


def retry_now(session: Session, version_id: int) -> dict[str, Any]:
    """Make a pending copy due now (404: no copy; 409: it is not pending)."""
    copy = session.get(MlflowExport, version_id)
    if copy is None:
        raise not_found("mlflow_copy", version_id)
    if copy.status != ExportStatus.pending:
        raise conflict(
            "not_pending", f"the copy of version id {version_id} is {copy.status}: nothing to retry"
        )
    copy.next_attempt_at = utcnow()
    number = session.scalar(select(ModelVersion.number).where(ModelVersion.id == version_id))
    return _row(copy, int(number or 0))


def _row(copy: MlflowExport, number: int) -> dict[str, Any]:
    view = export_view(copy)
    assert view is not None
    return {
        **view,
        "version_id": copy.version_id,
        "model_id": copy.model_id,
        "number": number,
        "next_attempt_at": copy.next_attempt_at if copy.status == ExportStatus.pending else None,
    }
