"""GET /v1/privacy/preview: what the next release of a model would cost."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query

from app.api.deps import AnyRole, DbDep
from app.services.privacy import preview as preview_release

router = APIRouter(prefix="/v1/privacy", tags=["privacy"])


@router.get("/preview")
def preview(
    _: AnyRole,
    db: DbDep,
    model: int,
    epsilon: float | None = Query(None),
    delta: float | None = Query(None),
) -> dict[str, Any]:
    """Noise σ, feasibility for the model's method and the lineage budget it would use."""
    with db.read() as session:
        return preview_release(session, model, epsilon, delta)
