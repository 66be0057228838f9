"""The unlearning methods the service offers, as the HTTP layer needs to know them.

The maths lives in workers/methods/<name>.py; this table names each method, its guarantee
and the schema of its options, so requests are validated without importing torch.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class OutputPerturbationOptions(BaseModel):
    """Seed 002 eq. (1): clip the model to norm C0, add one Gaussian draw (Δ = 2·C0), then
    optionally fine-tune on the retained data without noise (post-processing)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    C0: float = Field(1.0, gt=0.0, le=1e6)
    finetune_epochs: int = Field(0, ge=0, le=1000)
    finetune_learning_rate: float = Field(0.05, gt=0.0, le=10.0)


class RecollectionOptions(BaseModel):
    """Seed 003: training records one recollection vector per sample; a deletion adds them."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    C: float = Field(10.0, gt=0.0, le=1e6, description="batch-gradient clipping norm")
    q: float = Field(0.995, gt=0.0, le=1.0, description="per-step learning-rate decay")
    storage_dtype: Literal["float32", "float16"] = "float32"
    per_subject: bool = Field(False, description="one summed vector per data subject")
    rho_checks: int = Field(10, ge=1, le=1000, description="steps where ρ is measured")
    power_iterations: int = Field(20, ge=5, le=500)
    max_sigma: float | None = Field(None, gt=0.0, description="retrain exactly above this σ")
    max_relative_noise: float | None = Field(
        1.0,
        gt=0.0,
        description="retrain exactly when the noise norm σ√d exceeds this multiple "
        "of the weights' norm (the release would be useless); null disables the guard",
    )
    evaluate: bool = Field(
        False,
        description="evaluate each update against the coupled "
        "retrain (costs one retrain per update)",
    )


class NewtonOptions(BaseModel):
    """Seed 004: projected training onto ‖w‖ ≤ C; a LiSSA Newton step on the retained data;
    Gaussian noise on the Proposition 4.1 bound. L, M, λ_min default to the paper's values."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
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
    residual_tolerance: float = Field(
        1e-4,
        ge=0.0,
        description="use the forget-set gradient shortcut only when ‖∇L(w*, D)‖ is below this",
    )
    guard: float = Field(10.0, gt=1.0, description="divergence when ‖P_j‖ > guard·(j+1)‖v‖")
    guard_retries: int = Field(2, ge=0, le=10)
    guard_raise: Literal["H_sc", "lam"] = "H_sc"
    power_iterations: int = Field(30, ge=5, le=1000)
    max_relative_noise: float | None = Field(1.0, gt=0.0)
    evaluate: bool = False


class NoisyFinetuneOptions(BaseModel):
    """Seed 002: T noisy SGD steps on the retained data from the clipped model, then optional
    noiseless fine-tuning. Give σ (T is found) or T (σ is found), or both (checked)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    variant: Literal["gradient_clipping", "model_clipping"] = "gradient_clipping"
    C0: float = Field(1.0, gt=0.0, le=1e6, description="initial model clip")
    C1: float = Field(10.0, gt=0.0, le=1e6, description="gradient clip (gradient clipping)")
    C2: float = Field(1.0, gt=0.0, le=1e6, description="projection radius (model clipping)")
    lam: float = Field(0.0, ge=0.0, le=1e6, description="L2 factor λ")
    gamma: float = Field(1e-2, gt=0.0, le=10.0, description="step size γ")
    sigma: float | None = Field(None, gt=0.0, le=1e6)
    T: int | None = Field(None, ge=1, le=100_000)
    T_max: int = Field(1000, ge=1, le=100_000)
    sigma0: float = Field(0.0, ge=0.0, description="initial noise (model clipping)")
    tight: bool = Field(False, description="model clipping: the repo's tighter recursion")
    batch_size: int = Field(64, ge=1, le=65536)
    finetune_epochs: int = Field(0, ge=0, le=1000)
    finetune_learning_rate: float = Field(0.05, gt=0.0, le=10.0)

    @model_validator(mode="after")
    def _consistent(self) -> NoisyFinetuneOptions:
        if self.sigma is None and self.T is None:
            raise ValueError("give sigma (the steps T are found) or T (σ is found)")
        if self.variant == "gradient_clipping" and self.gamma * self.lam >= 1:
            raise ValueError("Theorem A.9 needs γ·λ < 1")
        return self


KNOWN_METHODS: dict[str, dict[str, Any]] = {
    "retrain": {"guarantee": "exact", "module": "workers.methods.retrain", "options": NoOptions},
    "output_perturbation": {
        "guarantee": "rigorous",
        "module": "workers.methods.output_perturbation",
        "options": OutputPerturbationOptions,
    },
    "recollection": {
        "guarantee": "conditional",
        "module": "workers.methods.recollection",
        "options": RecollectionOptions,
        "records_training": True,
    },
    "newton": {
        "guarantee": "conditional",
        "module": "workers.methods.newton",
        "options": NewtonOptions,
        "records_training": True,
    },
    "noisy_finetune": {
        "guarantee": "rigorous",
        "module": "workers.methods.noisy_finetune",
        "options": NoisyFinetuneOptions,
    },
}


def validate_options(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Check a method's options against its schema; returns them with defaults filled in."""
    return KNOWN_METHODS[name]["options"].model_validate(options).model_dump()
