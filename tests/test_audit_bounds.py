"""The one-run lower bound on ε (issue 31, first part; Steinke, Nasr & Jagielski 2023)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from app.privacy.audit_bounds import epsilon_lower_bound, p_value, perfect_attack_ceiling


def test_without_delta_it_is_the_exact_binomial_test() -> None:
    """δ = 0: the bound is the ε where scipy's one-sided exact binomial test has p = 0.05,
    found here independently by root finding on `binomtest`."""
    for r, v in [(100, 70), (500, 300), (1000, 900), (50, 50)]:

        def gap(eps: float, r: int = r, v: int = v) -> float:
            q = 1 / (1 + math.exp(-eps))
            return stats.binomtest(v, r, q, alternative="greater").pvalue - 0.05

        expected = optimize.brentq(gap, 0.0, 30.0, xtol=1e-10)
        assert epsilon_lower_bound(1000, r, v, delta=0.0) == pytest.approx(expected, abs=1e-6)


def test_guessing_at_chance_proves_nothing_and_right_guesses_prove_more() -> None:
    assert epsilon_lower_bound(1000, 1000, 500) == 0.0
    assert epsilon_lower_bound(1000, 1000, 520) == 0.0  # within chance at 95 %
    bounds = [epsilon_lower_bound(1000, 200, v) for v in (130, 150, 170, 190, 200)]
    assert bounds == sorted(bounds) and bounds[0] > 0
    assert epsilon_lower_bound(1000, 200, 170, delta=1e-3) < epsilon_lower_bound(
        1000, 200, 170, delta=1e-6
    )  # a looser δ leaves less to prove
    with pytest.raises(ValueError):
        p_value(10, 5, 6, 1.0, 1e-5)


def test_the_ceiling_grows_with_the_canaries() -> None:
    """What a perfect attack can prove: every guess right, the best number of guesses."""
    ceilings = [perfect_attack_ceiling(m) for m in (100, 1000)]
    assert ceilings[0] < ceilings[1] < 6.5
    assert ceilings[1] >= epsilon_lower_bound(1000, 1000, 1000)


def test_the_bound_is_sound_for_randomized_response() -> None:
    """A mechanism that is exactly ε = 1 DP per canary (randomized response): over 300 runs of
    1,000 canaries the 95 % lower bound exceeds the true ε in about 5 % of them, not more."""
    rng = np.random.default_rng(0)
    true_eps, runs, m = 1.0, 300, 1000
    q = math.exp(true_eps) / (1 + math.exp(true_eps))
    right = rng.binomial(m, q, size=runs)
    above = sum(epsilon_lower_bound(m, m, int(v), delta=1e-5) > true_eps for v in right)
    assert above <= 0.08 * runs
    assert np.median([epsilon_lower_bound(m, m, int(v), delta=1e-5) for v in right[:30]]) > 0.7
