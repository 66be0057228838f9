"""`output_perturbation` (seed 002 eq. 1): clip, add one Gaussian draw, optionally fine-tune."""

from __future__ import annotations

from pydantic import Field

from app.core.specs import ArchitectureSpec
from app.core.states import Guarantee
from app.privacy.gaussian import sigma_for
from app.privacy.lineage import gaussian_event
from app.privacy.plans import MIN_NOISE_MULTIPLIER, ReleasePlan, declared
from app.privacy.validate import check_delta, check_epsilon
from methods.spec import MethodOptions, MethodSpec, register


class OutputPerturbationOptions(MethodOptions):
    """Seed 002 eq. (1): clip the model to norm C0, add one Gaussian draw (Δ = 2·C0), then
    optionally fine-tune on the retained data without noise (post-processing)."""

    C0: float = Field(1.0, gt=0.0, le=1e6)
    finetune_epochs: int = Field(0, ge=0, le=1000)
    finetune_learning_rate: float = Field(0.05, gt=0.0, le=10.0)


def output_perturbation_plan(c0: float, epsilon: float, delta: float) -> ReleasePlan:
    """Seed 002 eq. (1): both models lie in the C0 ball, so Δ = 2·C0."""
    check_epsilon(epsilon)
    check_delta(delta)
    sensitivity = 2.0 * c0
    sigma = sigma_for(sensitivity, epsilon, delta)
    return ReleasePlan(
        "output_perturbation",
        "rigorous",
        sigma,
        sensitivity,
        feasible=sigma / sensitivity >= MIN_NOISE_MULTIPLIER,
        constants={"C0": declared(c0, "clipping radius (enforced)")},
        event=gaussian_event(sigma, sensitivity, epsilon, delta),
    )


def norm_bound(
    o: OutputPerturbationOptions, _architecture: ArchitectureSpec, _features: int, _classes: int
) -> float | None:
    """The release before its noise lies in the C0 ball; fine-tuning after the noise
    (post-processing) moves it, so no bound holds for what is released then."""
    return o.C0 if o.finetune_epochs == 0 else None


def _plan(o: OutputPerturbationOptions, epsilon: float, delta: float) -> ReleasePlan:
    return output_perturbation_plan(o.C0, epsilon, delta)


SPEC = register(
    MethodSpec(
        name="output_perturbation",
        guarantee=Guarantee.rigorous,
        options=OutputPerturbationOptions,
        summary="clip to the C0 ball and add Gaussian noise calibrated on Δ = 2·C0",
        examples={
            "import": {
                "summary": "imported weights, released through the C0 ball",
                "value": {
                    "name": "imported",
                    "dataset_id": 1,
                    "architecture": '{"type": "logreg"}',
                    "method": '{"name": "output_perturbation", "C0": 1.0}',
                },
            }
        },
        planner=_plan,
        norm_bound=norm_bound,
    )
)
