"""`newton` (seed 004): projected training; a LiSSA Newton step on the retained data + noise."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from app.core.states import Guarantee
from methods.spec import MethodOptions, MethodSpec, register


class NewtonOptions(MethodOptions):
    """Seed 004: projected training onto ‖w‖ ≤ C; a LiSSA Newton step on the retained data;
    Gaussian noise on the Proposition 4.1 bound. L, M, λ_min default to the paper's values."""

    C: float = Field(10.0, gt=0.0, le=1e6, description="parameter-norm ball (enforced)")
    lam: float = Field(1.0, ge=0.0, le=1e7, description="local convex coefficient λ")
    H_sc: float = Field(10.0, gt=0.0, le=1e9, description="LiSSA scale H")
    depth: int = Field(1000, ge=1, le=100_000, description="LiSSA recursion depth s")
    chains: int = Field(10, ge=1, le=256)
    hvp_batch: int = Field(10, ge=1, le=100_000, description="samples per Hessian draw")
    L: float = Field(1.0, ge=0.0, description="declared gradient-Lipschitz constant")
    M: float = Field(1.0, ge=0.0, description="declared Hessian-Lipschitz constant")
    lam_min: float = Field(0.0, description="declared smallest Hessian eigenvalue")
    rho: float | None = Field(
        None, gt=0.0, lt=1.0, description="LiSSA failure probability, added to δ (default: δ/2)"
    )
    G_max: float = Field(
        1.0,
        ge=0.0,
        le=1e6,
        description="declared bound on the residual gradient G of Prop. 4.1, the one Δ and σ "
        "use: a measured G above it releases the exact retrain through the same noise",
    )
    residual_tolerance: float = Field(
        1e-4,
        ge=0.0,
        description="use the forget-set gradient shortcut only when ‖∇L(w*, D)‖ is below this",
    )
    guard: float = Field(10.0, gt=1.0, description="divergence when ‖P_j‖ > guard·(j+1)‖v‖")
    guard_retries: int = Field(2, ge=0, le=10)
    guard_raise: Literal["H_sc", "lam"] = "H_sc"
    power_iterations: int = Field(30, ge=5, le=1000)
    max_relative_noise: float | None = Field(
        1.0, gt=0.0, description="refuse σ√d above this times C (public values only)"
    )


SPEC = register(
    MethodSpec(
        name="newton",
        guarantee=Guarantee.conditional,
        options=NewtonOptions,
        summary="a LiSSA Newton step on the retained data, then Gaussian noise (Prop. 4.1)",
        records_training=True,
    )
)
