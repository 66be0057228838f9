"""What a method's next release costs, computed without torch: the workers calibrate their
noise with these functions and the API's preview shows the same numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.privacy.gaussian import sigma_for
from app.privacy.lineage import approx_event, gaussian_event, slope_event
from app.privacy.noisy_finetune import plan_gradient_clipping, plan_model_clipping
from app.privacy.validate import check_delta, check_epsilon

MIN_NOISE_MULTIPLIER = 1e-3  # below this σ/Δ the accountants' numbers are not trustworthy


@dataclass
class ReleasePlan:
    method: str
    guarantee: str
    sigma: float
    sensitivity: float
    feasible: bool | None
    reason: str = ""
    constants: dict[str, dict[str, Any]] = field(default_factory=dict)
    event: dict[str, Any] | None = None  # the release as a lineage event (None: no noise)
    steps: int | None = None  # noisy steps, for iterative mechanisms

    @property
    def noise_multiplier(self) -> float | None:
        return self.sigma / self.sensitivity if self.sensitivity > 0 else None


def _declared(value: float, meaning: str) -> dict[str, Any]:
    return {"value": value, "source": "declared", "meaning": meaning}


def release_plan(method: dict[str, Any], epsilon: float, delta: float) -> ReleasePlan:
    """σ, Δ (or the iterative equivalent) of the next release under `method` for (ε, δ)."""
    check_epsilon(epsilon)
    check_delta(delta)
    name = method.get("name", "retrain")
    if name == "retrain":
        return ReleasePlan("retrain", "exact", 0.0, 0.0, True, "exact retraining: ε = δ = 0")
    if name == "output_perturbation":
        return _output_perturbation(method, epsilon, delta)
    if name == "noisy_finetune":
        if method["variant"] == "gradient_clipping":
            return _gradient_clipping(method, epsilon, delta)
        return _model_clipping(method, epsilon, delta)
    return ReleasePlan(
        name,
        "conditional",
        0.0,
        0.0,
        None,
        "Δ depends on the removed samples and on constants measured during the "
        "update; σ is calibrated then",
    )


def _output_perturbation(method: dict[str, Any], epsilon: float, delta: float) -> ReleasePlan:
    """Seed 002 eq. (1): both models lie in the C0 ball, so Δ = 2·C0."""
    c0 = float(method["C0"])
    sensitivity = 2.0 * c0
    sigma = sigma_for(sensitivity, epsilon, delta)
    return ReleasePlan(
        "output_perturbation",
        "rigorous",
        sigma,
        sensitivity,
        feasible=sigma / sensitivity >= MIN_NOISE_MULTIPLIER,
        constants={"C0": _declared(c0, "clipping radius (enforced)")},
        event=gaussian_event(sigma, sensitivity, epsilon, delta),
    )


def _gradient_clipping(method: dict[str, Any], epsilon: float, delta: float) -> ReleasePlan:
    """Seed 002 Theorem A.9: T noisy steps; σ given → smallest T, T given → σ."""
    plan = plan_gradient_clipping(
        epsilon,
        delta,
        method["C0"],
        method["C1"],
        method["lam"],
        method["gamma"],
        sigma=method.get("sigma"),
        T=method.get("T"),
        T_max=method["T_max"],
    )
    constants = {
        k: _declared(method[k], meaning)
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
        2.0 * method["C0"],
        plan.feasible,
        ""
        if plan.feasible
        else "infeasible: no number of steps reaches the target at this σ (below the noise floor)",
        constants,
        slope_event(plan.slope, plan.epsilon, delta) if plan.feasible else None,
        plan.T,
    )


def _model_clipping(method: dict[str, Any], epsilon: float, delta: float) -> ReleasePlan:
    """Seed 002 Theorem 4.2: hockey-stick contraction, ε fixed, δ shrinking with T."""
    plan = plan_model_clipping(
        epsilon,
        delta,
        method["C2"],
        sigma=method.get("sigma"),
        T=method.get("T"),
        C0=method["C0"],
        sigma0=method["sigma0"],
        tight=method["tight"],
        T_max=method["T_max"],
    )
    constants = {
        k: _declared(method[k], meaning)
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
        2.0 * method["C2"],
        plan.feasible,
        "" if plan.feasible else "infeasible: δ does not reach the target within T_max steps",
        constants,
        approx_event(plan.epsilon, plan.delta) if plan.feasible else None,
        plan.T,
    )
