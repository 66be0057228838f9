"""Analytic Gaussian, Rényi-slope conversion and lineage composition: reference values from
the issue and property tests (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.privacy.gaussian import epsilon_for, sigma_for
from app.privacy.lineage import compose, compose_pld, exact_gaussian_composition
from app.privacy.rdp import epsilon_from_slope, mironov_epsilon, slope_budget
from app.privacy.validate import PrivacyParameterError
from methods import method_of

eps_st = st.floats(0.05, 20.0)
delta_st = st.floats(1e-10, 0.1)


def test_analytic_gaussian_reference_values() -> None:
    assert sigma_for(1.0, 1.0, 1e-5) == pytest.approx(3.7306, abs=5e-5)
    assert epsilon_for(1.0, 2.0, 1e-5) == pytest.approx(1.9931, abs=5e-5)
    assert sigma_for(3.0, 1.0, 1e-5) == pytest.approx(3 * 3.7306, abs=5e-4)
    classical = math.sqrt(2 * math.log(1.25 / 1e-5)) / 1.0
    assert sigma_for(1.0, 1.0, 1e-5) < classical  # the analytic mechanism needs less noise


def test_renyi_slope_is_counted() -> None:
    assert epsilon_from_slope(1.0, 1e-5) == pytest.approx(7.08, abs=0.01)
    assert epsilon_from_slope(0.0306, 1e-5) == pytest.approx(1.00, abs=0.005)
    assert slope_budget(1.0, 1e-5) == pytest.approx(0.03056, abs=2e-4)
    assert epsilon_from_slope(0.1, 1e-5) == pytest.approx(1.91, abs=0.01)
    # Balle et al. 2020 is tighter than Mironov 2017, never looser.
    assert epsilon_from_slope(1.0, 1e-5) <= mironov_epsilon(1.0, 1e-5)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(eps=eps_st, delta=delta_st, factor=st.floats(1.05, 4.0))
def test_sigma_decreases_as_epsilon_or_delta_grows(eps: float, delta: float, factor: float) -> None:
    assert sigma_for(1.0, eps * factor, delta) < sigma_for(1.0, eps, delta)
    assert sigma_for(1.0, eps, min(delta * factor, 0.5)) < sigma_for(1.0, eps, delta)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(eps=eps_st, delta=delta_st, sens=st.floats(1e-3, 1e3))
def test_epsilon_of_sigma_round_trips(eps: float, delta: float, sens: float) -> None:
    assert epsilon_for(sens, sigma_for(sens, eps, delta), delta) == pytest.approx(eps, rel=1e-6)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(eps=st.floats(0.1, 5.0), delta=st.floats(1e-8, 1e-3), k=st.integers(1, 12))
def test_k_releases_cost_between_one_and_k(eps: float, delta: float, k: int) -> None:
    z = sigma_for(1.0, eps, delta)
    spend = compose([z] * k, delta)
    assert spend.releases == k
    assert eps - 1e-3 <= spend.epsilon <= k * eps + 1e-3
    pld = compose_pld([z] * k, delta)  # dp-accounting's PLD accountant agrees
    assert spend.epsilon == pytest.approx(pld.epsilon, rel=2e-3, abs=2e-3)


def test_compose_mixed_multipliers_matches_closed_form() -> None:
    zs = [3.73, 5.0, 2.5, 3.73]
    spend = compose(zs, 1e-6)
    exact = epsilon_for(1.0, exact_gaussian_composition(zs), 1e-6)
    assert spend.epsilon == pytest.approx(exact, rel=1e-9)
    assert compose_pld(zs, 1e-6).epsilon == pytest.approx(exact, rel=2e-3)
    assert compose([], 1e-6).epsilon == 0.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: sigma_for(1.0, 0.0, 1e-5),
        lambda: sigma_for(1.0, -1.0, 1e-5),
        lambda: sigma_for(1.0, math.nan, 1e-5),
        lambda: sigma_for(1.0, math.inf, 1e-5),
        lambda: sigma_for(1.0, 1.0, 0.0),
        lambda: sigma_for(1.0, 1.0, 1.0),
        lambda: sigma_for(-1.0, 1.0, 1e-5),
        lambda: epsilon_for(1.0, math.nan, 1e-5),
        lambda: epsilon_from_slope(-1.0, 1e-5),
        lambda: compose([0.0], 1e-5),
        lambda: method_of({"name": "retrain"}).plan(1.0, 2.0),
    ],
)
def test_bad_parameters_raise(call) -> None:
    with pytest.raises(PrivacyParameterError):
        call()


def test_output_perturbation_plan() -> None:
    plan = method_of({"name": "output_perturbation", "C0": 0.5}).plan(1.0, 1e-5)
    assert plan.sensitivity == 1.0 and plan.sigma == pytest.approx(3.7306, abs=5e-5)
    assert plan.guarantee == "rigorous" and plan.feasible
    assert plan.constants["C0"]["source"] == "declared"
    exact = method_of({"name": "retrain"}).plan(1.0, 1e-5)
    assert (exact.sigma, exact.sensitivity, exact.guarantee) == (0.0, 0.0, "exact")


def test_preparing_the_next_admission_solves_its_epsilon_before_it_is_asked() -> None:
    """A worker composes the lineage with one more release like its newest between updates
    (`prepare_next`): the next admission of that release then solves nothing, and admits
    exactly what it would have admitted cold."""
    from app.privacy import gaussian
    from app.privacy.lineage import GaussianRelease, LineageBudget, admit, prepare_next

    z = 3.123456789  # a multiplier no other test composes
    history = [GaussianRelease(z, 1.0, 1e-5) for _ in range(7)]
    budget = LineageBudget(10.0, 1e-4)
    cold = compose([z] * 8, budget.delta)
    gaussian._epsilon.cache_clear()
    admit(budget, history[:-1], history[-1])  # the previous update: its "after" is cached
    prepare_next(budget, history)
    solved = gaussian._epsilon.cache_info().misses
    admission = admit(budget, history, history[-1])
    assert gaussian._epsilon.cache_info().misses == solved  # both lookups were hits
    assert admission.after == cold and admission.admitted
    prepare_next(budget, [])  # an exact retrain's empty lineage: nothing to prepare


def test_the_analytic_gaussian_epsilon_agrees_with_dp_accounting_and_never_undershoots() -> None:
    """app/privacy's own ε solver (Balle & Wang 2018, Thm 8) against dp-accounting's
    get_epsilon_gaussian over noise multipliers from 0.05 to 200 and δ from 1e-12 to 0.5:
    equal within the solvers' tolerance, and δ(ε) ≤ δ holds at the ε it returns."""
    from dp_accounting import get_epsilon_gaussian

    from app.privacy.gaussian import epsilon_of, log_delta

    for z in [0.05 * 1.25**i for i in range(37)]:
        for delta in (1e-12, 1e-9, 1e-6, 1e-5, 1e-3, 0.1, 0.5):
            mine, theirs = epsilon_of(z, delta), get_epsilon_gaussian(z, delta)
            assert abs(mine - theirs) <= 1e-11 * max(1.0, theirs), (z, delta)
            assert mine == 0.0 or log_delta(z, mine) <= math.log(delta), (z, delta)
    assert epsilon_of(1.0, 1.0) == 0.0 and epsilon_of(0.0, 1e-5) == math.inf
    assert epsilon_of(math.inf, 1e-5) == 0.0 and epsilon_of(2.0, 0.0) == math.inf
