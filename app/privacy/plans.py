"""What a mechanism's next release costs, computed without torch: each method's spec
(methods/<name>/spec.py) plans its release with these functions, the workers calibrate
their noise with that plan and the API's preview shows the same numbers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.privacy.lineage import LineageEvent
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
    event: LineageEvent | None = None  # the release as a lineage event (None: no noise)
    steps: int | None = None  # noisy steps, for iterative mechanisms
    # A method with a deletion capacity: its terms, the documents it allows and those used.
    capacity: dict[str, float] | None = None

    @property
    def noise_multiplier(self) -> float | None:
        return self.sigma / self.sensitivity if self.sensitivity > 0 else None


def declared(value: float, meaning: str) -> dict[str, Any]:
    return {"value": value, "source": "declared", "meaning": meaning}


def exact_plan(
    method: str, epsilon: float, delta: float, reason: str = "exact retraining: ε = δ = 0"
) -> ReleasePlan:
    """An exact method (retraining, or what equals it): ε = δ = 0 whatever the target."""
    check_epsilon(epsilon)
    check_delta(delta)
    return ReleasePlan(method, "exact", 0.0, 0.0, True, reason)


def data_dependent_plan(method: str, guarantee: str, epsilon: float, delta: float) -> ReleasePlan:
    """A method whose Δ is known only during the update (recollection, Newton)."""
    check_epsilon(epsilon)
    check_delta(delta)
    return ReleasePlan(
        method,
        guarantee,
        0.0,
        0.0,
        None,
        "Δ depends on the removed samples and on constants measured during the "
        "update; σ is calibrated then",
    )
