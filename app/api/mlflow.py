"""GET /v1/mlflow/copies: every version's copy in MLflow (status, attempts, last error, next
attempt); POST …/{version_id}/retry: a pending copy tried now, not after its back-off."""

from __future__ import annotations

from fastapi import APIRouter, Query

from app.api.deps import Admin, Auditor, DbDep, SettingsDep
from app.api.params import PathId
from app.api.responses import COMMON, errors
from app.core.jsontypes import JsonObject, JsonValue
from app.core.mlflow_export.copies import list_copies, retry_now
from app.core.states import ExportStatus
from app.core.wire import MlflowCopies, MlflowCopyRow

router = APIRouter(prefix="/v1/mlflow", tags=["integrations"], responses=COMMON)


@router.get("/copies", response_model=MlflowCopies)
def copies(
    _: Auditor,
    db: DbDep,
    settings: SettingsDep,
    status: ExportStatus | None = None,
    limit: int = Query(200, ge=1, le=1000),
) -> JsonObject:
    """The newest copies first (admins and auditors)."""
    with db.read() as session:
        items: list[JsonValue] = list(list_copies(session, status, limit))
    return {"configured": settings.mlflow_tracking_uri is not None, "items": items}


@router.post("/copies/{version_id}/retry", response_model=MlflowCopyRow, responses=errors(404, 409))
def retry(version_id: PathId, _: Admin, db: DbDep) -> JsonObject:
    """Try a pending copy now instead of after its back-off (registering twice makes nothing
    new in MLflow)."""
    with db.write() as session:
        return retry_now(session, version_id)
