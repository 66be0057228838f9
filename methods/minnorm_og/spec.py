"""`minnorm_og`: MinNorm-OG (seed 001, Algorithm 1 with the schedule of Appendix F.1.10), a
heuristic for deep networks. It makes NO privacy or exactness claim (seed 001 §B.6): there is
no noise mechanism and no bound on the distance to a retrained model, so its certificates say
guarantee `none` with ε and δ null, it leaves the lineage budget untouched, it runs only when
the model's policy sets `allow_heuristic: true`, and it is never chosen as a fallback.

Per forget batch: one AdamW step on a retained batch of the same size, then, on scheduled
epochs, θ ← θ − κ(θ − QQᵀθ) with Q an orthonormal basis of n_pert per-sample gradients of the
predicted-class logit; κ starts at κ₀ = λ_reg and decays by γ_reg after every projection; the
last T_GD epochs are descent only.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from app.core.states import Guarantee
from app.privacy.plans import ReleasePlan, declared
from app.privacy.validate import check_delta, check_epsilon
from methods.spec import MemoryFacts, MethodOptions, MethodSpec, register


class MinNormOGOptions(MethodOptions):
    """Appendix F.1.10's hyperparameters (the paper tunes them against the retrained model;
    these defaults are a starting point, not a selection rule)."""

    epochs: int = Field(10, ge=1, le=1000, description="T: passes over the forget batches")
    projection_every: int = Field(
        1, ge=1, le=1000, description="T_Proj: project when t % T_Proj = 0"
    )
    descent_only_epochs: int = Field(
        2, ge=0, le=1000, description="T_GD: final descent-only epochs"
    )
    batch_size: int = Field(64, ge=1, le=65536, description="n_B: forget and retain batch size")
    learning_rate: float = Field(1e-3, gt=0.0, le=10.0, description="η of AdamW")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay")
    kappa: float = Field(
        0.05,
        gt=0.0,
        le=1.0,
        description="κ₀ = λ_reg: first projection strength (on the digits MLP, κ₀ = 0.2 "
        "already halved test accuracy: bench/overparameterized.py)",
    )
    gamma: float = Field(0.9, ge=0.0, le=1.0, description="γ_reg: κ decays by it per projection")
    n_pert: int = Field(50, ge=1, le=1024, description="per-sample gradients per projection")
    rank_tolerance: float = Field(1e-8, gt=0.0, le=1e-1, description="SVD cut-off for Q")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="retain-batch order")

    @model_validator(mode="after")
    def _some_projection(self) -> MinNormOGOptions:
        if self.descent_only_epochs >= self.epochs:
            raise ValueError("descent_only_epochs must be below epochs, or nothing is projected")
        return self


def _plan(o: MinNormOGOptions, epsilon: float, delta: float) -> ReleasePlan:
    check_epsilon(epsilon)
    check_delta(delta)
    return ReleasePlan(
        "minnorm_og",
        "none",
        0.0,
        0.0,
        True,
        "heuristic: no privacy or exactness claim (seed 001 §B.6); runs only with "
        "allow_heuristic, never as a fallback",
        constants={
            "kappa": declared(o.kappa, "first projection strength κ₀ = λ_reg"),
            "gamma": declared(o.gamma, "decay of κ per projection"),
            "n_pert": declared(float(o.n_pert), "per-sample gradients per projection"),
        },
    )


def _memory(o: MinNormOGOptions, f: MemoryFacts) -> dict[str, int]:
    """Φ in float64 and its retained copy; K, its factor and K⁻¹ (n × n float64 each)."""
    return {
        "features": 2 * f.n_train * f.feature_width * 8,
        "gram": 3 * f.n_train * f.n_train * 8,
    }


SPEC = register(
    MethodSpec(
        name="minnorm_og",
        guarantee=Guarantee.none,
        options=MinNormOGOptions,
        summary="MinNorm-OG for deep networks (seed 001): a heuristic, no guarantee",
        planner=_plan,
        memory_terms=_memory,
    )
)
