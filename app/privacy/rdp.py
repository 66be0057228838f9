"""Rényi-slope bounds to (ε, δ).

Privacy amplification by iteration gives D_α(P‖Q) ≤ α·R for every order α > 1: an RDP curve
α ↦ α·R (a "slope" R, i.e. R-zCDP), not a flat ε. It is converted with dp-accounting's
`compute_epsilon` (Balle et al. 2020 / Canonne et al. 2020 conversion) over a dense order grid.
Reporting R itself as ε is the mistake of the noisy fine-tuning paper's experiments (seed 002,
note §6.1): R = 1 at δ = 1e-5 is ε ≈ 7.08, not 1.
"""

from __future__ import annotations

import math

import numpy as np

from app.privacy.validate import check_delta, check_epsilon, check_positive

ORDERS = np.unique(np.concatenate([np.linspace(1.02, 20.0, 2000), np.geomspace(20.0, 1e5, 2000)]))


def epsilon_from_slope(slope: float, delta: float) -> float:
    """ε at δ for the RDP curve α ↦ α·R."""
    check_positive("R", slope, allow_zero=True)
    check_delta(delta)
    if slope == 0:
        return 0.0
    from dp_accounting.rdp import compute_epsilon  # on first use (app/privacy/__init__.py)

    eps, _ = compute_epsilon(ORDERS, ORDERS * slope, delta)
    return float(eps)


def slope_budget(epsilon: float, delta: float) -> float:
    """The largest slope R whose conversion stays within ε at δ (bisection)."""
    check_epsilon(epsilon)
    check_delta(delta)
    lo, hi = 0.0, max(1.0, epsilon)
    while epsilon_from_slope(hi, delta) <= epsilon:
        hi *= 2
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if epsilon_from_slope(mid, delta) <= epsilon else (lo, mid)
    return lo


def mironov_epsilon(slope: float, delta: float) -> float:
    """Mironov 2017 Prop. 3 for the same curve, R + 2√(R ln(1/δ)): a looser cross-check."""
    return slope + 2 * math.sqrt(slope * math.log(1 / delta))
