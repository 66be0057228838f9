"""GET /v1/privacy/preview: what the next release of a model would cost."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from app.api.deps import AnyRole, DbDep
from app.api.responses import COMMON, errors
from app.schemas import MAX_ID
from app.security import Role
from app.services.privacy import preview as preview_release
from app.wire import PreviewOut

router = APIRouter(prefix="/v1/privacy", tags=["privacy"], responses=COMMON)


@router.get("/preview", response_model=PreviewOut, responses=errors(404))
def preview(
    key: AnyRole,
    db: DbDep,
    model: Annotated[int, Query(ge=1, le=MAX_ID)],
    epsilon: float | None = Query(None),
    delta: float | None = Query(None),
) -> PreviewOut:
    """Noise σ, feasibility for the model's method and the lineage budget it would use."""
    with db.read() as session:
        disclose = key.role in (Role.auditor, Role.admin)
        return preview_release(session, model, epsilon, delta, disclose)
