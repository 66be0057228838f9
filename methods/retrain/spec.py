"""`retrain`: exact retraining on the retained data (ε = δ = 0)."""

from __future__ import annotations

from app.core.states import Guarantee
from app.privacy.plans import ReleasePlan, exact_plan
from methods.spec import RETRAIN, MethodOptions, MethodSpec, register


class RetrainOptions(MethodOptions):
    """Retraining takes no options: it reuses the model's own training configuration."""


def _plan(_: RetrainOptions, epsilon: float, delta: float) -> ReleasePlan:
    return exact_plan(RETRAIN, epsilon, delta)


SPEC = register(
    MethodSpec(
        name=RETRAIN,
        guarantee=Guarantee.exact,
        options=RetrainOptions,
        summary="retrain from scratch on the retained data with the same seed",
        planner=_plan,
    )
)
