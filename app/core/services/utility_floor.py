"""The utility floor's public scale and the preview's view of it (methods/floor.py holds the
rule; docs/deletions.md explains it)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.db.tables import Model, ModelVersion
from app.core.states import Guarantee, VersionKind
from app.core.wire import UtilityFloorView
from app.privacy.plans import ReleasePlan
from architectures import kind_of
from methods import method_of
from methods.floor import FloorCheck

NOISE_FREE_KINDS = (VersionKind.trained, VersionKind.imported, VersionKind.retrained)
SCALE_BASIS = "the norm of the model's last noise-free version"


def public_norm(session: Session, model_id: int) -> float | None:
    """The norm of the model's newest noise-free version (trained, imported or retrained;
    its metrics keep it): the floor's scale. None: none recorded (a version made before the
    floor existed, or no version yet)."""
    metrics = session.scalar(
        select(ModelVersion.metrics)
        .where(ModelVersion.model_id == model_id, ModelVersion.kind.in_(NOISE_FREE_KINDS))
        .order_by(ModelVersion.number.desc())
        .limit(1)
    )
    norm = (metrics or {}).get("noise_free_norm")
    return float(norm) if isinstance(norm, int | float) else None


def floor_view(
    session: Session, model: Model, plan: ReleasePlan, n_features: int, n_classes: int
) -> UtilityFloorView | None:
    """What the floor says of the model's next release at `plan`: None where no floor applies
    (none set, an exact method, σ measured on the rows) or the model has no noise-free
    version to scale from yet."""
    share = model.privacy.max_relative_noise
    method = method_of(model.method)
    if share is None or method.spec.guarantee == Guarantee.exact:
        return None
    if plan.feasible is None or plan.sigma <= 0:
        return None
    scale = public_norm(session, model.id)
    kind = kind_of(model.architecture)
    if scale is None or not kind.network:
        return None
    noised = kind.parameters(model.architecture, n_features, n_classes)
    check = FloorCheck(plan.sigma, noised, share, scale, SCALE_BASIS)
    return UtilityFloorView(
        **check.figures(),
        below=check.below,
        then=(
            "the next release would be the exact retrain, for this public reason: " + check.reason()
            if check.below
            else "the next release keeps its noise under the floor"
        ),
    )
