"""What a method's next release costs, computed without torch: the worker calibrates its
noise with these functions and the API's preview shows the same numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.privacy.gaussian import sigma_for
from app.privacy.validate import check_delta, check_epsilon

MIN_NOISE_MULTIPLIER = 1e-3  # below this σ/Δ the accountants' numbers are not trustworthy


@dataclass
class ReleasePlan:
    method: str
    guarantee: str
    sigma: float
    sensitivity: float
    feasible: bool
    reason: str = ""
    constants: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def noise_multiplier(self) -> float | None:
        return self.sigma / self.sensitivity if self.sensitivity > 0 else None


def release_plan(method: dict[str, Any], epsilon: float, delta: float) -> ReleasePlan:
    """σ and Δ of the next release under `method` for the target (ε, δ)."""
    check_epsilon(epsilon)
    check_delta(delta)
    name = method.get("name", "retrain")
    if name == "retrain":
        return ReleasePlan("retrain", "exact", 0.0, 0.0, True, "exact retraining: ε = δ = 0")
    if name == "output_perturbation":
        c0 = float(method["C0"])
        sensitivity = 2.0 * c0  # seed 002 eq. (1): both models lie in the C0 ball
        sigma = sigma_for(sensitivity, epsilon, delta)
        return ReleasePlan(
            "output_perturbation",
            "rigorous",
            sigma,
            sensitivity,
            feasible=sigma / sensitivity >= MIN_NOISE_MULTIPLIER,
            constants={
                "C0": {
                    "value": c0,
                    "source": "declared",
                    "meaning": "clipping radius of the released model (enforced)",
                }
            },
        )
    return ReleasePlan(name, "unknown", 0.0, 0.0, False, f"no release plan for {name!r}")
