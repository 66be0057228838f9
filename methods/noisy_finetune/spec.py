"""`noisy_finetune` (seed 002): T noisy SGD steps on the retained data, then fine-tuning."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from app.core.states import Guarantee
from app.privacy.lineage import approx_event, slope_event
from app.privacy.plans import ReleasePlan, declared
from app.privacy.validate import check_delta, check_epsilon
from methods.noisy_finetune.accountant import plan_gradient_clipping, plan_model_clipping
from methods.spec import MethodOptions, MethodSpec, register


class NoisyFinetuneOptions(MethodOptions):
    """Seed 002: T noisy SGD steps on the retained data from the clipped model, then optional
    noiseless fine-tuning. Give σ (T is found) or T (σ is found), or both (checked)."""

    variant: Literal["gradient_clipping", "model_clipping"] = "gradient_clipping"
    C0: float = Field(1.0, gt=0.0, le=1e6, description="initial model clip")
    C1: float = Field(10.0, gt=0.0, le=1e6, description="gradient clip (gradient clipping)")
    C2: float = Field(1.0, gt=0.0, le=1e6, description="projection radius (model clipping)")
    lam: float = Field(0.0, ge=0.0, le=1e6, description="L2 factor λ")
    gamma: float = Field(1e-2, gt=0.0, le=10.0, description="step size γ")
    sigma: float | None = Field(
        None, ge=1e-6, le=1e6, description="noise σ (below 1e-6 no ε is finite; σ² underflows)"
    )
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


def gradient_clipping_plan(o: NoisyFinetuneOptions, epsilon: float, delta: float) -> ReleasePlan:
    """Seed 002 Theorem A.9: T noisy steps; σ given → smallest T, T given → σ."""
    check_epsilon(epsilon)
    check_delta(delta)
    plan = plan_gradient_clipping(
        epsilon, delta, o.C0, o.C1, o.lam, o.gamma, sigma=o.sigma, T=o.T, T_max=o.T_max
    )
    constants = {
        k: declared(getattr(o, k), meaning)
        for k, meaning in (
            ("C0", "initial model clip (enforced)"),
            ("C1", "gradient clip (enforced)"),
            ("lam", "L2 factor λ"),
            ("gamma", "step size γ"),
        )
    }
    return ReleasePlan(
        "noisy_finetune",
        "rigorous",
        plan.sigma,
        2.0 * o.C0,
        plan.feasible,
        ""
        if plan.feasible
        else "infeasible: no number of steps reaches the target at this σ (below the noise floor)",
        constants,
        slope_event(plan.slope, plan.epsilon, delta)
        if plan.feasible and plan.slope is not None
        else None,
        plan.T,
    )


def model_clipping_plan(o: NoisyFinetuneOptions, epsilon: float, delta: float) -> ReleasePlan:
    """Seed 002 Theorem 4.2: hockey-stick contraction, ε fixed, δ shrinking with T."""
    check_epsilon(epsilon)
    check_delta(delta)
    plan = plan_model_clipping(
        epsilon,
        delta,
        o.C2,
        sigma=o.sigma,
        T=o.T,
        C0=o.C0,
        sigma0=o.sigma0,
        tight=o.tight,
        T_max=o.T_max,
    )
    constants = {
        k: declared(getattr(o, k), meaning)
        for k, meaning in (
            ("C0", "initial model clip (enforced)"),
            ("C2", "projection radius (enforced)"),
            ("sigma0", "initial noise"),
        )
    }
    return ReleasePlan(
        "noisy_finetune",
        "rigorous",
        plan.sigma,
        2.0 * o.C2,
        plan.feasible,
        "" if plan.feasible else "infeasible: δ does not reach the target within T_max steps",
        constants,
        approx_event(plan.epsilon, plan.delta) if plan.feasible else None,
        plan.T,
    )


def _plan(o: NoisyFinetuneOptions, epsilon: float, delta: float) -> ReleasePlan:
    if o.variant == "gradient_clipping":
        return gradient_clipping_plan(o, epsilon, delta)
    return model_clipping_plan(o, epsilon, delta)


SPEC = register(
    MethodSpec(
        name="noisy_finetune",
        guarantee=Guarantee.rigorous,
        options=NoisyFinetuneOptions,
        summary="noisy SGD on the retained data (gradient or model clipping)",
        planner=_plan,
    )
)
