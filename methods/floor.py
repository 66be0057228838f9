"""The utility floor (docs/deletions.md): a noisy release whose expected noise norm σ·√d, over
the d parameters it noises, exceeds the policy's `max_relative_noise` share of a public scale of
the model's norm is noise rather than a model, and Lethe releases the exact retrain instead.
Every term is public, so the branch it picks reveals nothing of which rows left."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.core.specs import ArchitectureSpec, PrivacyPolicy
from architectures import kind_of
from methods.spec import MethodChoice


@dataclass(frozen=True)
class FloorCheck:
    """The planned noise against the floor, with every figure a reader needs to redo it."""

    sigma: float
    noised_parameters: int
    max_relative_noise: float
    scale: float
    scale_basis: str  # what the scale is the norm of

    @property
    def expected_noise_norm(self) -> float:
        """E‖N(0, σ²I_d)‖ ≈ σ·√d."""
        return self.sigma * math.sqrt(self.noised_parameters)

    @property
    def below(self) -> bool:
        return self.expected_noise_norm > self.max_relative_noise * self.scale

    def reason(self) -> str:
        return (
            f"its noise (σ = {self.sigma:.3g} on {self.noised_parameters} parameters, norm "
            f"about {self.expected_noise_norm:.3g}) would exceed max_relative_noise = "
            f"{self.max_relative_noise:g} of {self.scale_basis} ({self.scale:.3g}): a release "
            "that noisy is not a usable model"
        )

    def figures(self) -> dict[str, float | int | str]:
        return {
            "sigma": self.sigma,
            "noised_parameters": self.noised_parameters,
            "expected_noise_norm": self.expected_noise_norm,
            "max_relative_noise": self.max_relative_noise,
            "scale": self.scale,
            "scale_basis": self.scale_basis,
        }


def at_creation(
    choice: MethodChoice,
    architecture: ArchitectureSpec,
    n_features: int,
    n_classes: int,
    policy: PrivacyPolicy,
) -> FloorCheck | None:
    """The floor against the method's data-free bound on the trained model's norm, at the
    policy's (ε, δ): noise above `max_relative_noise` of that bound is above it of the
    model's norm, whatever the data, so every release of such a policy would be the exact
    retrain. None: no floor, no bound, or no data-free σ."""
    share, bound_of = policy.max_relative_noise, choice.spec.norm_bound
    if share is None or bound_of is None or not kind_of(architecture).network:
        return None
    bound = bound_of(choice.options, architecture, n_features, n_classes)
    plan = choice.plan(policy.epsilon, policy.delta)
    if bound is None or plan.feasible is None or plan.sigma <= 0:
        return None
    noised = kind_of(architecture).parameters(architecture, n_features, n_classes)
    return FloorCheck(plan.sigma, noised, share, bound, "the bound on a trained model's norm")
