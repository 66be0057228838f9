"""The one-run lower bound on ε."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from app.privacy.audit_bounds import (
    audit_scores,
    epsilon_lower_bound,
    fdp_epsilon_lower_bound,
    implied_per_canary,
    p_value,
    perfect_attack_ceiling,
)
from app.privacy.gaussian import epsilon_for


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


def test_the_fdp_bound_is_sound_and_tighter_than_the_one_run_bound() -> None:
    """Mahloujifar et al.'s f-DP bound, checked independently: a μ-GDP mechanism may score
    canaries independently (score = μ·bit + N(0, 1)); its right guesses are then
    Binomial(r, Φ(μ/2)) at best, so the f-DP bound can never exceed the ε of the μ that
    scipy's exact binomial test rejects. And it proves more than the one-run bound."""
    for m, r, v in [(1000, 1000, 700), (1000, 1000, 900), (1000, 200, 190), (100, 100, 90)]:
        q = optimize.brentq(lambda q, r=r, v=v: stats.binom.sf(v - 1, r, q) - 0.05, 0.5, 1 - 1e-12)
        binomial_eps = epsilon_for(1.0, 1.0 / (2 * stats.norm.ppf(q)), 1e-5)
        fdp = fdp_epsilon_lower_bound(m, r, v)
        assert epsilon_lower_bound(m, r, v) < fdp < binomial_eps
    assert fdp_epsilon_lower_bound(1000, 1000, 500) == 0.0
    assert fdp_epsilon_lower_bound(1000, 50, 50) > epsilon_lower_bound(1000, 50, 50)


@pytest.mark.long
def test_the_fdp_bound_is_sound_for_a_gaussian_mechanism() -> None:
    """Scores of a mechanism that is exactly μ-GDP per canary (μ = 1, ε ≈ 4.0 at δ = 1e-5):
    over 40 runs the 95 % audit (every guess rule, Bonferroni) stays below the true ε in at
    least 95 % of them, for both bounds."""
    rng = np.random.default_rng(1)
    mu, delta, m = 1.0, 1e-5, 1000
    true_eps = epsilon_for(1.0, 1.0 / mu, delta)
    above = {"one_run": 0, "fdp": 0}
    for _ in range(40):
        bits = rng.random(m) < 0.5
        found = audit_scores(mu * bits + rng.standard_normal(m), bits, delta)
        above["one_run"] += found.one_run.epsilon > true_eps
        above["fdp"] += found.fdp.epsilon > true_eps
        assert 0.6 < found.auc < 0.85  # Φ(μ/√2) = 0.76
    assert above["one_run"] <= 2 and above["fdp"] <= 2


def test_an_audit_of_a_perfect_attack_reaches_its_ceiling() -> None:
    rng = np.random.default_rng(2)
    bits = rng.random(1000) < 0.5
    found = audit_scores(bits.astype(float), bits, 1e-5)
    assert found.auc == 1.0
    assert found.one_run.epsilon == pytest.approx(found.ceiling_one_run)
    assert found.fdp.epsilon == pytest.approx(found.ceiling_fdp)
    assert found.ceiling_one_run < found.ceiling_fdp
    chance = audit_scores(rng.standard_normal(1000), bits, 1e-5)
    assert chance.one_run.epsilon < 0.5 and 0.4 < chance.auc < 0.6


def test_the_implied_bound_per_canary() -> None:
    """Two releases each (ε, δ)-close to one common release are (2ε, (1 + e^ε)δ)-close."""
    eps, delta = implied_per_canary(1.0, 1e-5)
    assert eps == 2.0 and delta == pytest.approx((1 + math.e) * 1e-5)
