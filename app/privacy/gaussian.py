"""The analytic Gaussian mechanism (Balle & Wang 2018, "Improving the Gaussian mechanism for
differential privacy", Thm 8), through dp-accounting.

Never σ = Δ·√(2 ln(1.25/δ))/ε: that classical bound (Dwork & Roth Thm A.1) only holds for
ε < 1 and is loose even there.
"""

from __future__ import annotations

import math
from functools import lru_cache

from dp_accounting import get_epsilon_gaussian, get_sigma_gaussian

from app.privacy.validate import check_delta, check_epsilon, check_positive


def sigma_for(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ making x ↦ x + N(0, σ²I) (ε, δ)-DP for an L2 sensitivity Δ."""
    check_positive("Δ", sensitivity, allow_zero=True)
    return float(sensitivity * _multiplier(check_epsilon(epsilon), check_delta(delta)))


def epsilon_for(sensitivity: float, sigma: float, delta: float) -> float:
    """The ε (at δ) of a Gaussian mechanism with noise σ and L2 sensitivity Δ."""
    check_positive("Δ", sensitivity, allow_zero=True)
    check_positive("σ", sigma, allow_zero=True)
    check_delta(delta)
    if sensitivity == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    return _epsilon(sigma / sensitivity, delta)


def epsilon_of_multiplier(noise_multiplier: float, delta: float) -> float:
    """The ε (at δ) of a Gaussian mechanism with noise multiplier z = σ/Δ (cached)."""
    check_positive("σ/Δ", noise_multiplier)
    return _epsilon(noise_multiplier, check_delta(delta))


# Both are pure functions of floats that dp-accounting solves numerically (5 % of a warm
# update at a million rows, issue 28); a model's updates repeat the same ones.
@lru_cache(maxsize=4096)
def _multiplier(epsilon: float, delta: float) -> float:
    return float(get_sigma_gaussian(epsilon, delta))


@lru_cache(maxsize=4096)
def _epsilon(noise_multiplier: float, delta: float) -> float:
    return float(get_epsilon_gaussian(noise_multiplier, delta))
