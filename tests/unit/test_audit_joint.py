"""The joint test of a certificate's own claim: every release R(b) is (ε, δ)-close
to one release R₀ that does not depend on the canaries' bits b, so for a statistic fixed in
advance P[T ≥ t] ≤ e^ε·P₀[T ≥ t] + δ, and ln((α/K − δ)/p₀) lower-bounds ε. Checked here: the
exact binomial tail, soundness on mechanisms whose joint ε is known (a tilted randomized
response that is tight for count statistics, and the Gaussian mechanism), the table of issue
56 recomputed from its audits' own counts, and no failure for any ε."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from app.privacy.audit_bounds import (
    SHIFT_SHARE,
    auc,
    auc_ceiling,
    auc_log_p_value,
    auc_log_tail,
    auc_p_value,
    audit_scores,
    guess_rules,
    joint_bound,
    joint_shift_log_p,
    log_binomial_tail,
)
from app.privacy.gaussian import sigma_for

ALPHA = 0.05


def test_the_binomial_tail_is_exact_and_does_not_underflow() -> None:
    for r, v in [(10, 7), (200, 153), (500, 250)]:
        direct = sum(math.comb(r, k) for k in range(v, r + 1)) / 2**r
        assert log_binomial_tail(r, v) == pytest.approx(math.log(direct), rel=1e-9)
    assert log_binomial_tail(5000, 5000) == pytest.approx(-5000 * math.log(2), rel=1e-9)


def tilted_release(
    m: int, epsilon: float, rng: np.random.Generator, bits: np.ndarray
) -> np.ndarray:
    """Scores of a mechanism exactly ε-close (δ = 0) to one that ignores the bits, and tight
    for the all-guesses count: the reference draws guesses g uniformly; this one reweights
    every g whose agreement with the bits reaches t by e^ε (then normalises), so its density
    ratio to the reference is at most e^ε and P[agreement ≥ t] = e^ε·p₀/(1 + (e^ε − 1)·p₀)."""
    t = int(stats.binom.isf(1e-4, m, 0.5))  # a tail the test can see
    p0 = float(stats.binom.sf(t - 1, m, 0.5))
    high = math.exp(epsilon) * p0 / (1 + (math.exp(epsilon) - 1) * p0)
    agree_low, agree_high = np.arange(0, t), np.arange(t, m + 1)
    if rng.random() < high:
        weights = stats.binom.pmf(agree_high, m, 0.5)
        k = rng.choice(agree_high, p=weights / weights.sum())
    else:
        weights = stats.binom.pmf(agree_low, m, 0.5)
        k = rng.choice(agree_low, p=weights / weights.sum())
    agree = np.zeros(m, dtype=bool)
    agree[rng.choice(m, size=k, replace=False)] = True
    guesses = np.where(agree, bits, ~bits)
    return guesses + 1e-6 * rng.standard_normal(m)  # a guess "in" scores above one "out"


@pytest.mark.parametrize("epsilon", [1.0, 5.0])
def test_the_joint_bound_is_sound_for_a_tight_randomized_response(epsilon: float) -> None:
    """300 runs of a mechanism whose joint ε is exactly `epsilon`: the 95 % bound exceeds it
    in at most α of them (it never does here: Bonferroni over the statistics)."""
    rng = np.random.default_rng(7)
    m, above, positive = 400, 0, 0
    for _ in range(300):
        bits = rng.random(m) < 0.5
        found = joint_bound(tilted_release(m, epsilon, rng, bits), bits, 0.0, rng=rng,
                            permutations=500)  # fmt: skip
        above += found.epsilon > epsilon
        positive += found.epsilon > 0
    assert above <= ALPHA * 300, above
    if epsilon == 5.0:
        assert positive > 0  # the mechanism is visible: the test is not vacuous


def test_the_joint_bound_is_sound_for_the_gaussian_mechanism() -> None:
    """θ = Σ b_i·c_i + N(0, σ²I) with orthogonal c_i of norm Δ/√m (so every b is within Δ of
    b = 0, the release without canaries), σ the analytic Gaussian's for (ε, δ) = (1, 1e-5):
    each canary's score is its coordinate. Over 300 runs the bound exceeds ε = 1 in ≤ α."""
    rng = np.random.default_rng(11)
    m, epsilon, delta, above = 1000, 1.0, 1e-5, 0
    sigma = sigma_for(1.0, epsilon, delta)
    for _ in range(300):
        bits = rng.random(m) < 0.5
        scores = bits / math.sqrt(m) + sigma * rng.standard_normal(m)
        above += joint_bound(scores, bits, delta, rng=rng, permutations=500).epsilon > epsilon
    assert above <= ALPHA * 300, above


# The table of issue 56: each audit's own counts (guesses, right) and certified ε, the verdict
# the per-canary test gave, and the ε the certificate's own claim lets those counts prove.
TABLE = [
    ("Gaussian logreg, λ_min 1e6", 500, 484, 1.0, "violated", 272),
    ("Gaussian logreg, λ_min 1e5", 500, 465, 1.0, "violated", 217),
    ("Gaussian logreg, λ_min 3e4, max_relative_noise 10", 200, 153, 1.0, "consistent", 26),
    ("wine MLP 128², 300 epochs", 500, 463, 1.0, "violated", 212),
    ("digits MLP 64², 20 epochs", 500, 287, 1.0, "consistent", 1.96),
]


@pytest.mark.parametrize(("case", "r", "v", "claim", "before", "proves"), TABLE)
def test_the_table_s_audits_under_the_joint_test(
    case: str, r: int, v: int, claim: float, before: str, proves: float
) -> None:
    """The issue computed its last column with 13 statistics; with the AUC the grid has 14,
    so each bound here is ln(14/13) ≈ 0.074 lower. Every row is now `violated`."""
    k = len(guess_rules(1000)) + 1
    bound = math.log(ALPHA / k - 1e-5) - log_binomial_tail(r, v)
    tolerance = 0.5 if proves > 10 else 0.01  # the issue rounds its figures
    assert bound + math.log(k / 13) == pytest.approx(proves, abs=tolerance), case
    assert bound > claim, case  # violated, whatever the per-canary test said (`before`)


def test_a_perfect_attack_reaches_its_ceiling_and_chance_proves_nothing() -> None:
    rng = np.random.default_rng(3)
    m = 1000
    bits = rng.random(m) < 0.5
    k = len(guess_rules(m)) + 1
    chance = joint_bound(rng.standard_normal(m), bits, 1e-5, rng=rng)
    assert chance.epsilon == 0.0 and chance.statistics == k
    assert chance.ceiling == pytest.approx(m * math.log(2) + math.log(ALPHA / k - 1e-5))
    assert 687 < chance.ceiling < 688  # the "about 688"
    perfect = joint_bound(bits + 0.0, bits, 1e-5, rng=rng)
    assert perfect.epsilon > 500  # the two-sided rules cannot split exactly n_in / n_out


def test_the_auc_p_value_is_valid_and_small_for_a_strong_signal() -> None:
    rng = np.random.default_rng(5)
    m = 500
    rejections = 0
    for _ in range(200):  # under the null (scores independent of the bits)
        bits = rng.random(m) < 0.5
        rejections += auc_p_value(rng.standard_normal(m), bits, rng, 199) <= 0.05
    assert rejections <= 0.05 * 200 + 3 * math.sqrt(200 * 0.05)
    bits = rng.random(m) < 0.5
    strong = auc_p_value(bits + 0.5 * rng.standard_normal(m), bits, rng, 999)
    assert strong == pytest.approx(1 / 1000)


@pytest.mark.parametrize("epsilon", [1.0, 5.0, 50.0, 500.0])
def test_no_epsilon_makes_the_audit_fail(epsilon: float) -> None:
    """ε = 50 made δ′ = (1 + e^ε)δ clamp to 1 and the f-DP helper raise: the per-canary
    bounds are now 0 there, and the joint test (δ once) still tests."""
    rng = np.random.default_rng(9)
    bits = rng.random(1000) < 0.5
    delta_prime = min(1.0, (1 + math.exp(min(epsilon, 700))) * 1e-5)
    found = audit_scores(bits + 0.3 * rng.standard_normal(1000), bits, delta_prime,
                         joint_delta=1e-5, rng=rng)  # fmt: skip
    assert found.joint is not None and found.joint.epsilon > 100
    if delta_prime >= 1:
        assert found.one_run.epsilon == 0.0 and found.ceiling_one_run == 0.0


def test_a_delta_above_the_level_rejects_nothing() -> None:
    rng = np.random.default_rng(4)
    bits = rng.random(100) < 0.5
    found = joint_bound(bits + 0.0, bits, 0.01, rng=rng)
    assert found.epsilon == 0.0 and found.ceiling == 0.0


def test_the_auc_is_no_longer_capped_by_its_permutations() -> None:
    """The AUC's p-value was at least 1/(N + 1), so it could never prove more than ≈ 4.27;
    with Serfling's tail beside the Monte Carlo one a strong ranking proves far more, and
    the ceiling with 1,000 canaries is about 118."""
    rng = np.random.default_rng(12)
    m = 1000
    bits = rng.random(m) < 0.5
    strong = bits + 0.3 * rng.standard_normal(m)
    log_p = auc_log_p_value(strong, bits, rng, 999)
    assert log_p < math.log(1 / 1000) - 20  # far below the Monte Carlo floor
    assert log_p <= math.log(2) + auc_log_tail(strong, bits) + 1e-12
    assert 118 < auc_ceiling(m, 1e-5) < 119


def test_serfling_s_tail_bounds_the_permutation_tail() -> None:
    """Over random permutations of the bits the AUC exceeds its observed value no more often
    than the bound says (checked where the Monte Carlo can see it)."""
    rng = np.random.default_rng(13)
    m = 200
    for shift in (0.1, 0.2, 0.3):
        bits = rng.random(m) < 0.5
        scores = bits * shift + rng.standard_normal(m)
        observed = auc(scores, bits)
        permuted = [auc(scores, rng.permutation(bits)) for _ in range(4000)]
        tail = (1 + sum(a >= observed for a in permuted)) / 4001
        assert tail <= math.exp(auc_log_tail(scores, bits)) + 3 * math.sqrt(tail / 4001)


def test_the_joint_shift_is_sound_and_finds_a_pull_left_behind() -> None:
    """Under the certificate's reference z is N(0, 1): over 2,000 audits the bound with the
    joint shift exceeds ε = 1 in at most α of them; a release that kept its canaries' pull
    (z about 4) is found above ε = 1 (the joint shift gets half of α)."""
    rng = np.random.default_rng(14)
    m, above = 200, 0
    for _ in range(2000):
        bits = rng.random(m) < 0.5
        found = joint_bound(rng.standard_normal(m), bits, 1e-5, rng=rng, permutations=50,
                            shift=float(rng.standard_normal()))  # fmt: skip
        above += found.epsilon > 1.0
    assert above <= ALPHA * 2000, above
    bits = rng.random(m) < 0.5
    pulled = joint_bound(rng.standard_normal(m), bits, 1e-5, rng=rng, shift=4.0)
    assert pulled.statistic.startswith("joint shift") and pulled.epsilon > 1.0
    assert pulled.statistics == len(guess_rules(m)) + 2
    assert pulled.epsilon == pytest.approx(
        math.log(ALPHA * SHIFT_SHARE - 1e-5) - joint_shift_log_p(4.0)
    )
