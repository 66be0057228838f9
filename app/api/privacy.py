"""GET /v1/privacy/preview: what the next release of a model would cost; GET
/v1/privacy/methods: what each method would promise and cost for a model not yet created."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from app.api.deps import AnyRole, DbDep
from app.api.responses import COMMON, errors
from app.core.schemas import MAX_ID
from app.core.security import Role
from app.core.services.method_choice import method_choices
from app.core.services.privacy import preview as preview_release
from app.core.wire import MethodChoices, PreviewOut

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


@router.get("/methods", response_model=MethodChoices, responses=errors(404, 409, 422))
def methods(
    key: AnyRole,
    db: DbDep,
    dataset: Annotated[int, Query(ge=1, le=MAX_ID)],
    architecture: Annotated[
        Literal["logreg", "mlp", "random_features"],
        Query(description="an architecture type built from its defaults"),
    ] = "logreg",
    epsilon: Annotated[float, Query(gt=0, le=100)] = 1.0,
    delta: Annotated[float, Query(gt=0, lt=1)] = 1e-5,
) -> MethodChoices:
    """Before creating a model: each method's guarantee, first-release σ, whether it can
    serve this dataset and architecture (with the API's refusal if not) and the cost of one
    deletion, so a method is chosen with numbers."""
    with db.read() as session:
        disclose = key.role in (Role.auditor, Role.admin)
        return method_choices(session, dataset, {"type": architecture}, epsilon, delta, disclose)
