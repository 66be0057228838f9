"""Lineage accounting: after the first deletion every release of a model is a Gaussian
mechanism on the erased data, so a lineage's releases compose.

The accountant's state is the list of releases (lineage events) since the last exact
retrain. Lethe derives it from the certificates (each stores σ and Δ), so it survives
restarts and is as tamper-evident as the hash-chained audit log itself.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import dp_accounting
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from app.privacy import DP_ACCOUNTING_VERSION
from app.privacy.validate import check_delta, check_positive

PLD_NAME = f"dp-accounting {DP_ACCOUNTING_VERSION} PLD (Gaussian releases composed)"
RDP_NAME = f"dp-accounting {DP_ACCOUNTING_VERSION} RDP (fallback)"
EXACT_NAME = (
    f"exact Gaussian composition (Dong, Roth & Su 2022), ε by dp-accounting "
    f"{DP_ACCOUNTING_VERSION} analytic Gaussian"
)


@dataclass(frozen=True)
class LineageSpend:
    epsilon: float
    delta: float
    releases: int
    accountant: str


def _events(multipliers: list[float]) -> Counter:
    for z in multipliers:
        check_positive("σ/Δ", z)
    return Counter(round(z, 12) for z in multipliers)


def compose(multipliers: list[float], delta: float) -> LineageSpend:
    """ε at δ of the composition of Gaussian releases with noise multipliers z_i = σ_i/Δ_i.

    Gaussian releases compose exactly into one Gaussian with z = (Σ z_i⁻²)^(-1/2) (Dong, Roth
    & Su 2022, Cor. 3.3), whose ε is dp-accounting's analytic Gaussian: exact, and O(1) where
    the PLD accountant needs a convolution per distinct release (`compose_pld` agrees to 0.2%
    in the tests and remains the cross-check).
    """
    check_delta(delta)
    if not multipliers:
        return LineageSpend(0.0, 0.0, 0, EXACT_NAME)
    z = exact_gaussian_composition(multipliers)
    eps = float(dp_accounting.get_epsilon_gaussian(z, delta))
    if not math.isfinite(eps):
        raise ValueError("lineage ε is not finite")
    return LineageSpend(eps, delta, len(multipliers), EXACT_NAME)


def compose_pld(multipliers: list[float], delta: float) -> LineageSpend:
    """The same composition with dp-accounting's PLD accountant (RDP as its fallback)."""
    check_delta(delta)
    events = _events(multipliers)
    try:
        accountant = PLDAccountant()
        for z, count in events.items():
            accountant.compose(dp_accounting.GaussianDpEvent(z), count)
        eps, name = float(accountant.get_epsilon(delta)), PLD_NAME
    except (ValueError, OverflowError, ArithmeticError):
        accountant = RdpAccountant()
        for z, count in events.items():
            accountant.compose(dp_accounting.GaussianDpEvent(z), count)
        eps, name = float(accountant.get_epsilon(delta)), RDP_NAME
    return LineageSpend(eps, delta, len(multipliers), name)


def exact_gaussian_composition(multipliers: list[float]) -> float:
    """k Gaussian releases compose exactly into one with multiplier (Σ z_i⁻²)^(-1/2)
    (Dong, Roth & Su 2022, Cor. 3.3): a closed form to cross-check the PLD accountant."""
    return 1.0 / math.sqrt(sum(1.0 / z**2 for z in _events(multipliers).elements()))


BASIC_NAME = "basic composition of the releases' (ε, δ) (a hockey-stick release is present)"
SLOPE_NAME = (
    f"dp-accounting {DP_ACCOUNTING_VERSION} RDP conversion of the summed slopes "
    "(a Rényi-slope release is present)"
)


def gaussian_event(sigma: float, sensitivity: float, epsilon: float, delta: float) -> dict:
    """A release x + N(0, σ²I) with L2 sensitivity Δ."""
    return {"kind": "gaussian", "z": sigma / sensitivity, "epsilon": epsilon, "delta": delta}


def slope_event(slope: float, epsilon: float, delta: float) -> dict:
    """A release with D_α ≤ α·R for all α (privacy amplification by iteration)."""
    return {"kind": "rdp_slope", "slope": slope, "epsilon": epsilon, "delta": delta}


def approx_event(epsilon: float, delta: float) -> dict:
    """A release known only as (ε, δ) (e.g. hockey-stick contraction)."""
    return {"kind": "approx", "epsilon": epsilon, "delta": delta}


def compose_events(events: list[dict], delta: float) -> LineageSpend:
    """Compose a lineage's releases with the tightest accountant that covers all of them:
    PLD when every release is Gaussian; summed Rényi slopes (a Gaussian with multiplier z has
    slope 1/(2z²)) when some are slope bounds; basic composition when any is only (ε, δ)."""
    check_delta(delta)
    kinds = {e["kind"] for e in events}
    if not events or kinds == {"gaussian"}:
        return compose([e["z"] for e in events], delta)
    if "approx" not in kinds:
        from app.privacy.rdp import epsilon_from_slope

        total = sum(
            e["slope"] if e["kind"] == "rdp_slope" else 1 / (2 * e["z"] ** 2) for e in events
        )
        return LineageSpend(epsilon_from_slope(total, delta), delta, len(events), SLOPE_NAME)
    return LineageSpend(
        float(sum(e["epsilon"] for e in events)),
        float(min(1.0, sum(e["delta"] for e in events))),
        len(events),
        BASIC_NAME,
    )
