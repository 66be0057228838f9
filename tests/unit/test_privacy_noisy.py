"""Accountants of seed 002 (noisy fine-tuning): methods.noisy_finetune.accountant."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.privacy.gaussian import epsilon_for
from app.privacy.rdp import slope_budget
from app.privacy.validate import PrivacyParameterError
from methods.noisy_finetune.accountant import (
    NoisyPlan,
    gc_certificate,
    gc_sigma_needed,
    gc_slope,
    gc_slope_const,
    gc_steps_needed,
    mc_delta,
    mc_sigma_needed,
    mc_steps_closed_form,
    mc_steps_needed,
    op_epsilon,
    op_sensitivity,
    op_sigma,
    op_sigma_paper_eq1,
    plan_gradient_clipping,
    plan_model_clipping,
    theta,
)

EPS, DELTA = 1.0, 1e-5

# Paper Table 7 (gradient clipping, CIFAR-10), note 002 §5.2: budget → (λ, C1, γ, C0, T, σ).
TABLE_7 = {
    1: (200, 100, 1e-3, 0.1, 1, 0.254558),
    4: (50, 10, 1e-2, 1.0, 5, 0.275702),
    7: (50, 10, 1e-2, 20, 11, 0.256790),
    10: (50, 100, 1e-4, 0.1, 10, 0.088213),
    13: (1, 10, 1e-3, 0.1, 10, 0.089197),
    16: (50, 10, 1e-3, 0.1, 10, 0.077256),
    19: (1, 10, 1e-3, 0.1, 10, 0.089197),
    22: (50, 100, 1e-4, 0.1, 10, 0.088213),
    25: (500, 100, 1e-3, 1.0, 5, 0.275702),
    28: (50, 10, 1e-2, 20, 11, 0.256790),
    31: (500, 100, 1e-3, 20, 11, 0.256790),
    34: (50, 1, 1e-3, 1.0, 93, 0.012501),
    37: (50, 100, 1e-3, 0.1, 1, 0.275772),
    40: (500, 100, 1e-3, 1.0, 5, 0.275702),
    43: (1, 10, 1e-2, 0.1, 1, 0.281429),
    46: (500, 100, 1e-3, 20, 11, 0.256790),
    49: (1, 10, 1e-2, 0.1, 1, 0.281429),
}


@pytest.fixture(scope="module")
def budget() -> float:
    return slope_budget(EPS, DELTA)


# ---------------------------------------------------------------- gradient clipping (Thm A.9)


@pytest.mark.parametrize("row", sorted(TABLE_7))
def test_table7_rows_calibrate_a_slope_of_one(row: int) -> None:
    lam, C1, gamma, C0, T, sigma = TABLE_7[row]
    slope = gc_slope_const(C0, C1, lam, gamma, sigma, T)
    assert round(slope, 3) == 1.000
    general = gc_slope(C0, C1, lam, [gamma] * T, [sigma] * T)
    assert general == pytest.approx(slope, rel=1e-12)


def test_row16_slope_one_is_epsilon_7_not_1() -> None:
    lam, C1, gamma, C0, T, sigma = TABLE_7[16]
    eps, delta, slope = gc_certificate(C0, C1, lam, gamma, sigma, T, DELTA)
    assert delta == DELTA
    assert slope == pytest.approx(1.0, abs=1e-4)
    assert eps == pytest.approx(7.08, abs=0.02)
    # R(τ) still decreases up to τ = 10 here, so the best prefix is T itself.
    assert gc_certificate(C0, C1, lam, gamma, sigma, T, DELTA, best_prefix=False)[0] == eps


def test_sigma_for_a_true_epsilon_one(budget: float) -> None:
    # Note §3.7 / §6.1: row 16 needs σ = 0.442 for a true (1, 1e-5), not 0.0773.
    sigma = gc_sigma_needed(EPS, DELTA, C0=0.1, C1=10, lam=50, gamma=1e-3, T=10)
    assert sigma == pytest.approx(0.442, abs=5e-4)
    eps, _, slope = gc_certificate(0.1, 10, 50, 1e-3, sigma, 10, DELTA)
    assert slope == pytest.approx(budget, rel=1e-9)
    assert eps == pytest.approx(EPS, abs=1e-6)


def test_constant_closed_form_matches_general_for_lambda_zero_and_tiny_gamma_lambda() -> None:
    for lam, gamma in ((0.0, 1e-2), (1e-9, 1e-3), (0.3, 2.0)):
        for T in (1, 2, 7, 40):
            const = gc_slope_const(0.5, 3.0, lam, gamma, 0.2, T)
            assert gc_slope(0.5, 3.0, lam, [gamma] * T, [0.2] * T) == pytest.approx(const, rel=1e-9)
    # λ = 0 closed form of note §3.2: 2(C0 + γC1T)²/(σ²T).
    assert gc_slope_const(0.5, 3.0, 0.0, 1e-2, 0.2, 7) == pytest.approx(
        2 * (0.5 + 1e-2 * 3.0 * 7) ** 2 / (0.2**2 * 7)
    )


def _forward_shift(C0, C1, lam, gammas, a):
    """z_T of the shift recursion z_{t+1} = ρ_t z_t + 2γ_t C1 − a_t, z_0 = 2C0 (Thm A.9 proof)."""
    z = 2 * C0
    for g, a_t in zip(gammas, a, strict=True):
        z = (1 - g * lam) * z + 2 * g * C1 - a_t
    return z


def test_per_step_schedule_uses_corrected_indices() -> None:
    C0, C1, lam = 0.5, 2.0, 3.0
    gammas = np.array([0.02, 0.3, 0.05, 0.25, 0.1])
    sigmas = np.array([0.3, 0.1, 0.5, 0.2, 0.4])
    T = len(gammas)
    rho = 1 - gammas * lam
    slope = gc_slope(C0, C1, lam, gammas, sigmas)

    # Independent check from the recursion itself: the optimal shifts a_t = c·P_t σ_t² (P_t =
    # Π_{k=t+1}^{T−1} ρ_k) close the shift exactly (z_T = 0) and their cost is the slope.
    P = np.array([np.prod(rho[t + 1 :]) for t in range(T)])
    base = _forward_shift(C0, C1, lam, gammas, np.zeros(T))
    unit = base - _forward_shift(C0, C1, lam, gammas, P * sigmas**2)
    a_opt = (base / unit) * P * sigmas**2
    assert _forward_shift(C0, C1, lam, gammas, a_opt) == pytest.approx(0.0, abs=1e-12)
    assert np.sum(a_opt**2 / (2 * sigmas**2)) == pytest.approx(slope, rel=1e-12)
    # ... and no other feasible shift sequence is cheaper (close the shift with the last a_t).
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = np.abs(a_opt + rng.normal(0, 0.05, T))
        a[-1] += _forward_shift(C0, C1, lam, gammas, a)
        if a[-1] >= 0:
            assert np.sum(a**2 / (2 * sigmas**2)) >= slope * (1 - 1e-12)

    # The paper's printed indices Π_{k=1}^{T−1−t} ρ_k (and σ_t inside the sum over k) give a
    # different, wrong number once γ_t varies.
    P_typo = np.array([np.prod(rho[1 : T - t]) for t in range(T)])
    shift = np.prod(rho) * 2 * C0 + np.sum(P_typo * 2 * gammas * C1)
    slope_typo = shift**2 / (2 * np.sum(P_typo**2 * sigmas**2))
    assert abs(slope_typo - slope) / slope > 0.05
    # With a constant schedule both indexings agree.
    g, s = [0.1] * T, [0.3] * T
    assert gc_slope(C0, C1, lam, g, s) == pytest.approx(gc_slope_const(C0, C1, lam, 0.1, 0.3, T))


def test_steps_needed_returns_none_below_the_noise_floor() -> None:
    # λ = 0: min_T R(T) = 8γC0C1/σ² (note §6.2) = 0.08/σ²; σ = 1 gives a floor above R* = 0.0306.
    assert gc_steps_needed(EPS, DELTA, C0=1.0, C1=10, lam=0, gamma=1e-3, sigma=1.0) is None
    # λ > 0: R(T) → 2γC1²(2−γλ)/(λσ²) and min R < floor; far below both, nothing certifies.
    assert gc_steps_needed(EPS, DELTA, 0.1, 10, 50, 1e-3, sigma=0.1, T_max=5000) is None
    plan = plan_gradient_clipping(EPS, DELTA, 0.1, 10, 50, 1e-3, sigma=0.1, T_max=5000)
    assert not plan.feasible and plan.T is None and plan.epsilon > EPS


def _brute_force(budget, C0, C1, lam, gamma, sigma, T_max):
    for T in range(1, T_max + 1):
        if gc_slope_const(C0, C1, lam, gamma, sigma, T) <= budget:
            return T
    return None


def test_steps_needed_is_the_smallest_T_for_a_non_monotone_slope(budget: float) -> None:
    # λ = 0: R(T) = 2(C0 + γC1T)²/(σ²T) is U-shaped, min 0.08/σ² at T* = 100. With
    # σ² = 0.1/R* only a middle window of T certifies.
    sigma = math.sqrt(0.1 / budget)
    T = gc_steps_needed(EPS, DELTA, 1.0, 10, 0, 1e-3, sigma, T_max=2000)
    assert _brute_force(budget, 1.0, 10, 0, 1e-3, sigma, 2000) == T
    assert T is not None and 1 < T < 100
    assert gc_slope_const(1.0, 10, 0, 1e-3, sigma, 2000) > budget  # the slope rises again
    # λ > 0 with λC0 < C1 (row 16): R dips to 0.00585/σ² at T = 14, then rises to the floor
    # 0.0078/σ². Put R* in between.
    sigma = math.sqrt(0.0068 / budget)
    T = gc_steps_needed(EPS, DELTA, 0.1, 10, 50, 1e-3, sigma, T_max=3000)
    assert _brute_force(budget, 0.1, 10, 50, 1e-3, sigma, 3000) == T
    assert gc_slope_const(0.1, 10, 50, 1e-3, sigma, 3000) > budget
    # The prefix minimum keeps the certificate of 3000 noisy steps at the dip.
    eps_prefix = gc_certificate(0.1, 10, 50, 1e-3, sigma, 3000, DELTA)[0]
    eps_last = gc_certificate(0.1, 10, 50, 1e-3, sigma, 3000, DELTA, best_prefix=False)[0]
    assert eps_prefix < EPS < eps_last


def test_plan_gradient_clipping_finds_T_or_sigma(budget: float) -> None:
    lam, C1, gamma, C0 = 50, 10, 1e-3, 0.1
    by_T = plan_gradient_clipping(EPS, DELTA, C0, C1, lam, gamma, T=10)
    assert isinstance(by_T, NoisyPlan)
    assert by_T.feasible and by_T.T == 10 and by_T.sigma == pytest.approx(0.442, abs=5e-4)
    assert by_T.epsilon == pytest.approx(EPS, abs=1e-6) and by_T.delta == DELTA
    by_sigma = plan_gradient_clipping(EPS, DELTA, C0, C1, lam, gamma, sigma=0.45)
    assert by_sigma.feasible and by_sigma.slope <= budget and by_sigma.epsilon <= EPS
    assert gc_steps_needed(EPS, DELTA, C0, C1, lam, gamma, 0.45) == by_sigma.T
    both = plan_gradient_clipping(EPS, DELTA, C0, C1, lam, gamma, sigma=TABLE_7[16][5], T=10)
    assert not both.feasible and both.epsilon == pytest.approx(7.08, abs=0.02)
    with pytest.raises(PrivacyParameterError):
        plan_gradient_clipping(EPS, DELTA, C0, C1, lam, gamma)


# ---------------------------------------------------------------- model clipping (Thm 4.2)


def _theta_mp(eps: float, r: float) -> float:
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(60):
        Q = lambda x: mpmath.erfc(mpmath.mpf(x) / mpmath.sqrt(2)) / 2  # noqa: E731
        e, r = mpmath.mpf(eps), mpmath.mpf(r)
        return float(Q(e / r - r / 2) - mpmath.exp(e) * Q(e / r + r / 2))


@pytest.mark.parametrize(
    ("eps", "r"), [(1.0, 2.0), (1.0, 0.2), (0.1, 1.0), (5.0, 3.9), (1.0, 0.05), (20.0, 1.0)]
)
def test_theta_is_accurate_in_log_space(eps: float, r: float) -> None:
    exact = _theta_mp(eps, r)
    got = theta(eps, r)
    assert got >= exact * (1 - 1e-12)  # an upper bound ...
    assert got == pytest.approx(exact, rel=1e-8)  # ... and a tight one, even near e^{-200}
    assert got > 0


def test_theta_properties() -> None:
    rs = [0.01, 0.1, 0.5, 1.0, 2.0, 4.0, 10.0]
    vals = [theta(1.0, r) for r in rs]
    assert all(0 < v < 1 for v in vals)
    assert vals == sorted(vals)  # increasing in r = 2C/σ
    assert theta(1.0, 0.0) == 0.0
    assert theta(1.0, 1e-3) > 0  # underflow reports a positive upper bound, never 0
    # θ_0(r) is the total variation 2Q(−r/2) − 1 = 1 − 2Q(r/2).
    assert theta(0.0, 1.0) == pytest.approx(math.erf(0.5 / math.sqrt(2)), rel=1e-10)


# Note 002 §3.4: steps at ε = 1, δ = 1e-5, σ0 = 0 (repo recursion vs eq. (10)).
MC_TABLE = [(1.0, 6, 18), (1.25, 9, 29), (1.95, 36, 134), (0.1, 1, 1)]


@pytest.mark.parametrize(("ratio", "tight_steps", "eq10_steps"), MC_TABLE)
def test_model_clipping_steps(ratio: float, tight_steps: int, eq10_steps: int) -> None:
    sigma = 0.5
    C2 = ratio * sigma
    assert mc_steps_needed(EPS, DELTA, C2, sigma, tight=True) == tight_steps
    assert mc_steps_needed(EPS, DELTA, C2, sigma) == eq10_steps  # default: the paper's form
    assert mc_steps_closed_form(EPS, DELTA, C2, sigma) == eq10_steps
    for tight, T in ((True, tight_steps), (False, eq10_steps)):
        assert mc_delta(EPS, T, C2, sigma, tight=tight) <= DELTA
        if T > 1:
            assert mc_delta(EPS, T - 1, C2, sigma, tight=tight) > DELTA


def test_sanity_value_mc_steps_needed() -> None:
    assert mc_steps_needed(1, 1e-5, C2=0.5, sigma=0.5, tight=True) == 6


def test_iterated_product_agrees_with_eq10_with_initial_noise() -> None:
    for C2, sigma, C0, sigma0, delta in [
        (0.5, 0.5, 30.0, 40.0, 1e-5),
        (0.3, 0.4, 1.0, 5.0, 1e-8),
        (0.8, 0.5, 2.0, 0.5, 1e-3),
        (0.1, 1.0, 0.1, 10.0, 0.5),  # β ≤ δ already: no step needed
    ]:
        closed = mc_steps_closed_form(EPS, delta, C2, sigma, C0, sigma0)
        assert mc_steps_needed(EPS, delta, C2, sigma, C0, sigma0) == closed
        beta, alpha = theta(EPS, 2 * C0 / sigma0), theta(EPS, 2 * C2 / sigma)
        assert mc_delta(EPS, 7, C2, sigma, C0, sigma0) == pytest.approx(alpha**7 * beta, rel=1e-12)
        # The tight recursion never needs more steps.
        assert mc_steps_needed(EPS, delta, C2, sigma, C0, sigma0, tight=True) <= closed


def test_model_clipping_infeasible_and_plans() -> None:
    assert mc_steps_needed(EPS, DELTA, C2=5.0, sigma=0.5, T_max=50) is None
    assert mc_steps_needed(EPS, DELTA, C2=5.0, sigma=0.5, tight=True, T_max=50) is None
    plan = plan_model_clipping(EPS, DELTA, C2=0.5, sigma=0.5, tight=True)
    assert plan == NoisyPlan(6, 0.5, None, EPS, plan.delta, True) and plan.delta <= DELTA
    bad = plan_model_clipping(EPS, DELTA, C2=5.0, sigma=0.5, T_max=50)
    assert not bad.feasible and bad.T is None and bad.delta > DELTA
    for tight in (False, True):
        by_T = plan_model_clipping(EPS, DELTA, C2=0.5, T=6, tight=tight)
        assert by_T.feasible and by_T.delta <= DELTA
        sigma = by_T.sigma
        assert sigma == pytest.approx(mc_sigma_needed(EPS, DELTA, 0.5, 6, tight=tight))
        assert mc_delta(EPS, 6, 0.5, sigma * 0.999, tight=tight) > DELTA  # smallest σ
    # Tight: 6 steps at σ = C2 = 0.5 certify, so the σ it needs is at most 0.5.
    assert plan_model_clipping(EPS, DELTA, C2=0.5, T=6, tight=True).sigma <= 0.5
    assert plan_model_clipping(EPS, DELTA, C2=0.5, T=6).sigma > 0.5  # eq. (10) needs 18


# ---------------------------------------------------------------- output perturbation


def test_output_perturbation_uses_the_analytic_gaussian() -> None:
    assert op_sensitivity(1.0) == 2.0
    sigma = op_sigma(1.0, 1e-5, 1.0)
    assert sigma == pytest.approx(2 * 3.7306, rel=1e-4)
    assert epsilon_for(2 * 1.0, sigma, 1e-5) == pytest.approx(1.0, rel=1e-6)
    for eps, C0 in ((0.5, 0.1), (3.0, 20.0)):
        s = op_sigma(eps, 1e-5, C0)
        assert op_epsilon(s, 1e-5, C0) == pytest.approx(eps, rel=1e-6)
    # The paper's eq. (1) reproduces Table 9 (9.689610 / 0.968961 / 0.096896) but is loose.
    for C0, table in ((1.0, 9.689610), (0.1, 0.968961), (0.01, 0.096896)):
        assert op_sigma_paper_eq1(1.0, 1e-5, C0) == pytest.approx(table, abs=1e-6)
        assert op_sigma(1.0, 1e-5, C0) < op_sigma_paper_eq1(1.0, 1e-5, C0)


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "call",
    [
        lambda: gc_steps_needed(0.0, DELTA, 0.1, 10, 50, 1e-3, 0.5),
        lambda: gc_steps_needed(-1.0, DELTA, 0.1, 10, 50, 1e-3, 0.5),
        lambda: gc_steps_needed(math.nan, DELTA, 0.1, 10, 50, 1e-3, 0.5),
        lambda: gc_steps_needed(EPS, 0.0, 0.1, 10, 50, 1e-3, 0.5),
        lambda: gc_steps_needed(EPS, 1.0, 0.1, 10, 50, 1e-3, 0.5),
        lambda: gc_steps_needed(EPS, math.nan, 0.1, 10, 50, 1e-3, 0.5),
        lambda: gc_sigma_needed(EPS, 2.0, 0.1, 10, 50, 1e-3, 10),
        lambda: gc_slope_const(0.1, 10, 50, 0.02, 0.5, 10),  # γλ = 1
        lambda: gc_slope_const(0.1, 10, 50, 0.03, 0.5, 10),  # γλ > 1
        lambda: gc_slope_const(0.1, 10, 50, 1e-3, 0.0, 10),  # σ = 0
        lambda: gc_slope_const(0.1, 10, 50, 1e-3, math.nan, 10),
        lambda: gc_slope_const(0.1, 10, -1.0, 1e-3, 0.5, 10),  # λ < 0
        lambda: gc_slope_const(0.1, 10, 50, 1e-3, 0.5, 0),  # T = 0
        lambda: gc_slope(0.1, 10, 50, [1e-3, 0.02], [0.5, 0.5]),  # γ_1 λ = 1
        lambda: gc_slope(0.1, 10, 50, [1e-3, 1e-3], [0.5, 0.0]),  # σ_1 = 0
        lambda: gc_slope(0.1, 10, 50, [1e-3, 1e-3], [0.5]),  # lengths differ
        lambda: gc_slope(0.1, 10, 50, [], []),
        lambda: gc_slope(0.1, 10, 50, [math.nan], [0.5]),
        lambda: gc_certificate(0.1, 10, 50, 1e-3, 0.5, 10, 0.0),
        lambda: mc_delta(0.0, 5, 0.5, 0.5),
        lambda: mc_delta(EPS, 5, 0.5, 0.0),
        lambda: mc_delta(EPS, 5, 0.5, 0.5, sigma0=1.0),  # σ0 > 0 needs C0
        lambda: mc_steps_needed(EPS, 1.5, 0.5, 0.5),
        lambda: mc_steps_needed(math.nan, DELTA, 0.5, 0.5),
        lambda: op_sigma(0.0, DELTA, 1.0),
        lambda: op_sigma(EPS, 1.0, 1.0),
        lambda: op_sensitivity(-1.0),
        lambda: theta(1.0, -0.5),
    ],
)
def test_bad_inputs_raise(call) -> None:
    with pytest.raises(PrivacyParameterError):
        call()
