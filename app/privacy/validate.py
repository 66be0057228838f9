"""Argument checks shared by the accountants: ε > 0 finite, δ in (0, 1), Δ, σ ≥ 0 finite."""

from __future__ import annotations

import math


class PrivacyParameterError(ValueError):
    """An ε, δ, σ or Δ no mechanism can have (the API turns it into a 422)."""


def check_epsilon(epsilon: float) -> float:
    if not isinstance(epsilon, int | float) or not math.isfinite(epsilon) or epsilon <= 0:
        raise PrivacyParameterError(f"ε must be a finite number > 0, got {epsilon!r}")
    return float(epsilon)


def check_delta(delta: float) -> float:
    if not isinstance(delta, int | float) or not math.isfinite(delta) or not 0 < delta < 1:
        raise PrivacyParameterError(f"δ must be in (0, 1), got {delta!r}")
    return float(delta)


def check_positive(name: str, value: float, allow_zero: bool = False) -> float:
    ok = math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        raise PrivacyParameterError(
            f"{name} must be finite and {'≥' if allow_zero else '>'} 0, got {value!r}"
        )
    return float(value)


def check_finite(name: str, value: float) -> float:
    """`value` as a float if it is a finite real number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PrivacyParameterError(f"{name} must be a finite number, got {value!r}")
    return float(value)
