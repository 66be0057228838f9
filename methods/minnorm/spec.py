"""`minnorm`: exact unlearning of an overparameterized linear model by projection onto the
span of the retained inputs (seed 001, Theorem 4.1).

Training returns the minimum-norm interpolator of one-hot labels on features φ(x) (plain
features for `logreg`, frozen random features for `random_features`); removing samples
projects θ onto the span of the retained features, P_{S_r} θ, which IS the minimum-norm
interpolator of the retained data: what training on them alone returns. ε = δ = 0.
"""

from __future__ import annotations

from pydantic import Field

from app.core.errors import unprocessable
from app.core.specs import ArchitectureSpec, LogRegSpec, RandomFeaturesSpec
from app.core.states import Guarantee
from app.privacy.plans import ReleasePlan, exact_plan
from methods.spec import MemoryFacts, MethodOptions, MethodSpec, register


class MinNormOptions(MethodOptions):
    """The numerical tolerances of the min-norm solve and of its projection."""

    rank_tolerance: float = Field(
        1e-12,
        gt=0.0,
        le=1e-2,
        description="rows are treated as dependent when a Cholesky pivot of the Gram matrix "
        "falls below this × its largest diagonal entry (then an SVD least squares is used)",
    )
    refine_steps: int = Field(
        2, ge=0, le=10, description="iterative-refinement steps after each projection"
    )
    residual_tolerance: float = Field(
        1e-9,
        gt=0.0,
        le=1e-3,
        description="a projection whose relative interpolation residual exceeds this is "
        "recomputed from a fresh Gram factor of the retained rows",
    )


def feature_dimension(architecture: ArchitectureSpec, n_features: int) -> int | None:
    """p, the trained layer's inputs plus the bias, for the architectures minnorm serves."""
    if isinstance(architecture, RandomFeaturesSpec):
        return architecture.width + 1
    if isinstance(architecture, LogRegSpec):
        return n_features + 1
    return None


def check_model(
    _: MinNormOptions, architecture: ArchitectureSpec, n_train: int, n_features: int
) -> None:
    """422 unless the model is linear in its trained layer and overparameterized (n < p)."""
    p = feature_dimension(architecture, n_features)
    if p is None:
        raise unprocessable(
            "minnorm_needs_linear_model",
            "minnorm unlearns a model that is linear in its trained layer: use the "
            "`logreg` (plain features) or `random_features` architecture",
        )
    if n_train >= p:
        raise unprocessable(
            "not_overparameterized",
            f"minnorm needs more parameters than training samples, but n = {n_train} ≥ "
            f"p = {p}: the projection would remove nothing. Use `random_features` with "
            f"width ≥ {n_train}, or the `retrain` method",
            {"n_train": n_train, "parameters_per_output": p},
        )


def _plan(_: MinNormOptions, epsilon: float, delta: float) -> ReleasePlan:
    return exact_plan(
        "minnorm",
        epsilon,
        delta,
        "exact: the projection onto the retained span is the minimum-norm retrain "
        "(seed 001, Theorem 4.1): ε = δ = 0",
    )


def _memory(o: MinNormOptions, f: MemoryFacts) -> dict[str, int]:
    """Φ in float64 and its retained copy; K, its factor and K⁻¹ (n × n float64 each)."""
    return {
        "features": 2 * f.n_train * f.feature_width * 8,
        "gram": 3 * f.n_train * f.n_train * 8,
    }


SPEC = register(
    MethodSpec(
        name="minnorm",
        guarantee=Guarantee.exact,
        options=MinNormOptions,
        summary="exact projection of an overparameterized min-norm linear model (seed 001)",
        examples={
            "model": {
                "summary": "exact min-norm unlearning on random features",
                "value": {
                    "name": "rf",
                    "dataset_id": 1,
                    "architecture": {"type": "random_features", "width": 4096},
                    "method": {"name": "minnorm"},
                },
            }
        },
        records_training=True,
        planner=_plan,
        check_model=check_model,
        memory_terms=_memory,
    )
)
