"""Accountants of seed 002, noisy fine-tuning (Koloskova et al., ICML 2025; note 002).

Three certified ways of unlearning by fine-tuning on the retain set only:

- gradient clipping (§2.1, Theorem A.9): clip the model to C0 once, then T noisy SGD steps with
  the gradient clipped to C1, L2 factor λ, step γ_t and noise σ_t. Privacy amplification by
  iteration gives D_q ≤ q·R for every order q > 1: an RDP *slope* R, converted to (ε, δ) with
  `app.privacy.rdp.epsilon_from_slope`. Reporting R as ε is the paper's mistake (note §6.1):
  R = 1 at δ = 1e-5 is ε ≈ 7.08.
- model clipping (§2.2, Theorem 4.2): project every iterate onto the C2-ball and add noise;
  ε is fixed and δ contracts geometrically, δ_T = α^T·β (hockey-stick contraction).
- output perturbation (§2.3): clip to C0 and add Gaussian noise once (sensitivity 2·C0),
  calibrated with the analytic Gaussian mechanism, never the classical 1.25 formula.

Everything is a port of the reference accountant of note §3.7 with the corrections of §3.2
(product indices P_t = Π_{k=t+1}^{T−1} ρ_k, σ_k inside the sum) and §6.2 (no monotonicity
in T; a noise floor below which no T certifies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import log_ndtr

from app.privacy.gaussian import epsilon_for, sigma_for
from app.privacy.rdp import epsilon_from_slope, slope_budget
from app.privacy.validate import (
    PrivacyParameterError,
    check_delta,
    check_epsilon,
    check_positive,
)

__all__ = [
    "NoisyPlan",
    "gc_certificate",
    "gc_sigma_needed",
    "gc_slope",
    "gc_slope_const",
    "gc_steps_needed",
    "mc_delta",
    "mc_sigma_needed",
    "mc_steps_closed_form",
    "mc_steps_needed",
    "op_epsilon",
    "op_sensitivity",
    "op_sigma",
    "op_sigma_paper_eq1",
    "plan_gradient_clipping",
    "plan_model_clipping",
    "theta",
]


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_steps(name: str, T: int) -> int:
    if isinstance(T, bool) or not isinstance(T, int | np.integer) or T < 1:
        raise PrivacyParameterError(f"{name} must be an integer ≥ 1, got {T!r}")
    return int(T)


def _check_rate(gamma: float, lam: float) -> None:
    if gamma * lam >= 1:
        raise PrivacyParameterError(
            f"Theorem A.9 needs γ·λ < 1 (ρ = 1 − γλ > 0), got γ = {gamma!r}, λ = {lam!r}"
        )


def _check_gc(C0: float, C1: float, lam: float, gamma: float) -> None:
    check_positive("C0", C0, allow_zero=True)
    check_positive("C1", C1, allow_zero=True)
    check_positive("λ", lam, allow_zero=True)
    check_positive("γ", gamma, allow_zero=True)
    _check_rate(gamma, lam)


@lru_cache(maxsize=256)
def _budget(epsilon: float, delta: float) -> float:
    """slope_budget is an 80-step bisection: cache it per (ε, δ)."""
    return slope_budget(epsilon, delta)


# --------------------------------------------------------------------------------------------
# Gradient clipping: Theorem A.9
# --------------------------------------------------------------------------------------------


def gc_slope(
    C0: float, C1: float, lam: float, gammas: Sequence[float], sigmas: Sequence[float]
) -> float:
    """RDP slope R of T = len(gammas) gradient-clipping steps, Theorem A.9 eq. (21) with the
    corrected indices P_t = Π_{k=t+1}^{T−1} ρ_k, ρ_t = 1 − γ_t·λ (note 002 §3.2)."""
    check_positive("C0", C0, allow_zero=True)
    check_positive("C1", C1, allow_zero=True)
    check_positive("λ", lam, allow_zero=True)
    g = np.asarray(gammas, dtype=float)
    s = np.asarray(sigmas, dtype=float)
    if g.ndim != 1 or s.ndim != 1 or g.size == 0 or g.size != s.size:
        raise PrivacyParameterError(
            f"γ_t and σ_t must be two non-empty 1-D schedules of equal length, "
            f"got shapes {g.shape} and {s.shape}"
        )
    if not (np.all(np.isfinite(g)) and np.all(g >= 0)):
        raise PrivacyParameterError("every γ_t must be finite and ≥ 0")
    if not (np.all(np.isfinite(s)) and np.all(s > 0)):
        raise PrivacyParameterError("every σ_t must be finite and > 0")
    if np.any(g * lam >= 1):
        raise PrivacyParameterError("Theorem A.9 needs γ_t·λ < 1 for every step t")
    rho = 1.0 - g * lam
    # P[t] = Π_{k=t+1}^{T−1} ρ_k (empty product 1 at t = T−1): reversed cumulative product.
    P = np.ones_like(rho)
    P[:-1] = np.cumprod(rho[::-1])[::-1][1:]
    shift = P[0] * rho[0] * 2.0 * C0 + float(np.sum(P * 2.0 * g * C1))  # A, the shift budget
    noise = float(np.sum(P**2 * s**2))  # S, the effective noise
    return float(shift * shift / (2.0 * noise))


def _gc_slope_unit(C0: float, C1: float, lam: float, gamma: float, T: np.ndarray) -> np.ndarray:
    """R(T)·σ² of the constant schedule for an array of step counts (no checks)."""
    T = np.asarray(T, dtype=float)
    x = gamma * lam
    if x == 0.0:  # λ = 0 (or γ = 0): no contraction
        return 2.0 * (C0 + gamma * C1 * T) ** 2 / T
    log_rho = math.log1p(-x)
    rho_T = np.exp(T * log_rho)
    # (1 − ρ^T)/(γλ) and (1 − ρ^{2T})/(γλ(2 − γλ)) via expm1: no cancellation for small γλ.
    geo = -np.expm1(T * log_rho) / x
    shift = 2.0 * C0 * rho_T + 2.0 * gamma * C1 * geo
    noise = -np.expm1(2.0 * T * log_rho) / (x * (2.0 - x))
    return shift * shift / (2.0 * noise)


def gc_slope_const(C0: float, C1: float, lam: float, gamma: float, sigma: float, T: int) -> float:
    """Theorem A.9 for constant γ, σ (note 002 §3.2): λ > 0: γλ(2−γλ)·A²/(2σ²(1−ρ^{2T})),
    A = 2C0ρ^T + (2C1/λ)(1−ρ^T); λ = 0: 2(C0 + γC1T)²/(σ²T)."""
    _check_gc(C0, C1, lam, gamma)
    check_positive("σ", sigma)
    T = _check_steps("T", T)
    return float(_gc_slope_unit(C0, C1, lam, gamma, np.array([T]))[0] / sigma**2)


def _gc_prefix_min_unit(C0: float, C1: float, lam: float, gamma: float, T: int) -> float:
    return float(np.min(_gc_slope_unit(C0, C1, lam, gamma, np.arange(1, T + 1))))


def gc_certificate(
    C0: float,
    C1: float,
    lam: float,
    gamma: float,
    sigma: float,
    T: int,
    delta: float,
    best_prefix: bool = True,
) -> tuple[float, float, float]:
    """(ε, δ, R) of T constant gradient-clipping steps: Theorem A.9 slope → ε by Balle 2020.

    best_prefix: R = min_{τ≤T} R(τ). Steps after τ use D_r only, so they are post-processing
    of x_τ and cannot raise the divergence (note 002 §6.2); R(T) itself is not monotone in T.
    """
    _check_gc(C0, C1, lam, gamma)
    check_positive("σ", sigma)
    T = _check_steps("T", T)
    check_delta(delta)
    unit = (
        _gc_prefix_min_unit(C0, C1, lam, gamma, T)
        if best_prefix
        else float(_gc_slope_unit(C0, C1, lam, gamma, np.array([T]))[0])
    )
    slope = unit / sigma**2
    return epsilon_from_slope(slope, delta), float(delta), slope


def gc_steps_needed(
    epsilon: float,
    delta: float,
    C0: float,
    C1: float,
    lam: float,
    gamma: float,
    sigma: float,
    T_max: int = 100_000,
) -> int | None:
    """Smallest T ≤ T_max with Theorem A.9 slope R(T) ≤ slope_budget(ε, δ); None when σ is
    below the noise floor (note 002 §6.2). Exhaustive over T: R(T) is not monotone."""
    check_epsilon(epsilon)
    check_delta(delta)
    _check_gc(C0, C1, lam, gamma)
    check_positive("σ", sigma)
    T_max = _check_steps("T_max", T_max)
    budget = _budget(float(epsilon), float(delta))
    slopes = _gc_slope_unit(C0, C1, lam, gamma, np.arange(1, T_max + 1)) / sigma**2
    hits = np.flatnonzero(slopes <= budget)
    return int(hits[0]) + 1 if hits.size else None


def gc_sigma_needed(
    epsilon: float,
    delta: float,
    C0: float,
    C1: float,
    lam: float,
    gamma: float,
    T: int,
    best_prefix: bool = True,
) -> float:
    """Smallest constant σ for which T gradient-clipping steps certify (ε, δ): Theorem A.9,
    σ² = R(T; σ=1)/slope_budget(ε, δ) (min over prefixes τ ≤ T if best_prefix, as in
    gc_certificate)."""
    check_epsilon(epsilon)
    check_delta(delta)
    _check_gc(C0, C1, lam, gamma)
    T = _check_steps("T", T)
    unit = (
        _gc_prefix_min_unit(C0, C1, lam, gamma, T)
        if best_prefix
        else float(_gc_slope_unit(C0, C1, lam, gamma, np.array([T]))[0])
    )
    return math.sqrt(unit / _budget(float(epsilon), float(delta)))


@dataclass(frozen=True)
class NoisyPlan:
    """A noisy fine-tuning plan: T noisy steps at noise σ certify (epsilon, delta).

    slope is the Rényi slope R (gradient clipping only; None for model clipping). When
    feasible is False, no T ≤ T_max works (T is None) and epsilon/delta are the best reached.
    """

    T: int | None
    sigma: float
    slope: float | None
    epsilon: float
    delta: float
    feasible: bool


def plan_gradient_clipping(
    epsilon: float,
    delta: float,
    C0: float,
    C1: float,
    lam: float,
    gamma: float,
    sigma: float | None = None,
    T: int | None = None,
    T_max: int = 100_000,
) -> NoisyPlan:
    """Gradient-clipping plan (Theorem A.9 + Balle 2020): given σ, the smallest T; given T, the
    smallest σ; given both, the certificate of (σ, T) checked against ε."""
    check_epsilon(epsilon)
    check_delta(delta)
    _check_gc(C0, C1, lam, gamma)
    if sigma is None and T is None:
        raise PrivacyParameterError("give σ (to find T), T (to find σ), or both")
    if T is None:
        assert sigma is not None
        check_positive("σ", sigma)
        T_max = _check_steps("T_max", T_max)
        steps = gc_steps_needed(epsilon, delta, C0, C1, lam, gamma, sigma, T_max)
        if steps is None:  # report the floor reached within T_max
            eps_best, _, slope = gc_certificate(C0, C1, lam, gamma, sigma, T_max, delta)
            return NoisyPlan(None, float(sigma), slope, eps_best, float(delta), False)
        T = steps
    elif sigma is None:
        sigma = gc_sigma_needed(epsilon, delta, C0, C1, lam, gamma, T)
    eps_got, _, slope = gc_certificate(C0, C1, lam, gamma, sigma, T, delta)
    feasible = slope <= _budget(float(epsilon), float(delta)) * (1 + 1e-12)
    return NoisyPlan(int(T), float(sigma), slope, eps_got, float(delta), feasible)


# --------------------------------------------------------------------------------------------
# Model clipping: Theorem 4.2
# --------------------------------------------------------------------------------------------

_LOG_REL_ERR = 1e-12  # generous relative error of log_ndtr, used to keep θ an upper bound
_TINY = math.ulp(0.0)  # what θ reports when its true value underflows: still an upper bound


def theta(eps: float, r: float) -> float:
    """θ_ε(r) = Q(ε/r − r/2) − e^ε·Q(ε/r + r/2), eq. (9) of seed 002: E_ε(N(0,1)‖N(r,1)).

    Computed in log-space (log Q = log_ndtr(−x), what scipy.stats.norm.logsf uses) so that
    large arguments do not cancel; where the two tails nearly cancel, the floating-point error
    is added, so the result stays an upper bound; it is never 0 for r > 0 (note 002 §6.3).
    """
    check_positive("ε", eps, allow_zero=True)
    check_positive("r", r, allow_zero=True)
    if r == 0:
        return 0.0
    la = float(log_ndtr(-(eps / r - r / 2)))  # log Q(ε/r − r/2)
    lb = eps + float(log_ndtr(-(eps / r + r / 2)))  # log(e^ε·Q(ε/r + r/2))
    if la == -math.inf:  # θ < 1e-308: report the smallest positive float, never 0
        return _TINY
    err = _LOG_REL_ERR * max(1.0, abs(la), abs(lb) if math.isfinite(lb) else 0.0)
    # θ = e^{la}(1 − e^{lb−la}); pessimistic rounding on both factors.
    d = lb - la - err
    value = math.exp(la + err) * -math.expm1(min(d, 0.0)) if d < 0 else math.exp(la + err) * err
    return min(max(value, _TINY), 1.0)


def _log_expm1(x: float) -> float:
    """log(e^x − 1) for x > 0 without overflow."""
    return x + math.log1p(-math.exp(-x)) if x > 1 else math.log(math.expm1(x))


def _tight_eps(eps: float, d: float) -> float:
    """ε̃ = log(1 + (e^ε − 1)/δ_t), the order at which Balle et al. 2019 Thm 1 measures a step."""
    return float(np.logaddexp(_log_expm1(eps) - math.log(d), 0.0)) if eps > 0 else 0.0


def _check_mc(eps: float, C2: float, sigma: float, C0: float | None, sigma0: float) -> float:
    """Checks the model-clipping arguments and returns β = δ_0 (Theorem 4.2)."""
    check_epsilon(eps)
    check_positive("C2", C2, allow_zero=True)
    check_positive("σ", sigma)
    check_positive("σ0", sigma0, allow_zero=True)
    if sigma0 == 0:
        return 1.0
    if C0 is None:
        raise PrivacyParameterError("σ0 > 0 needs the initial clipping radius C0")
    check_positive("C0", C0, allow_zero=True)
    return theta(eps, 2 * C0 / sigma0)


def _mc_step(eps: float, d: float, r: float, alpha: float, tight: bool) -> float:
    """One contraction: δ·θ_ε(r) = δ·α (Lemma A.2), or δ·θ_ε̃(r) (tight, Balle 2019 Thm 1)."""
    return d * theta(_tight_eps(eps, d), r) if tight else d * alpha


def mc_delta(
    eps: float,
    T: int,
    C2: float,
    sigma: float,
    C0: float | None = None,
    sigma0: float = 0.0,
    tight: bool = False,
) -> float:
    """δ after T model-clipping steps at fixed ε, Theorem 4.2: δ_T = α^T·β, α = θ_ε(2C2/σ),
    β = θ_ε(2C0/σ0) (1 if σ0 = 0). tight=True: the repo recursion at ε̃_t (note 002 §3.4)."""
    d = _check_mc(eps, C2, sigma, C0, sigma0)
    if isinstance(T, bool) or not isinstance(T, int | np.integer) or T < 0:
        raise PrivacyParameterError(f"T must be an integer ≥ 0, got {T!r}")
    r = 2 * C2 / sigma
    alpha = theta(eps, r)
    for _ in range(int(T)):
        d = _mc_step(eps, d, r, alpha, tight)
        if d == 0.0:
            break
    return float(d)


def _mc_search(
    eps: float,
    delta: float,
    C2: float,
    sigma: float,
    C0: float | None,
    sigma0: float,
    tight: bool,
    T_max: int,
) -> tuple[int | None, float]:
    """(smallest T with δ_T ≤ δ or None, δ reached) by iterating the contraction."""
    d = _check_mc(eps, C2, sigma, C0, sigma0)
    check_delta(delta)
    r = 2 * C2 / sigma
    alpha = theta(eps, r)
    if d <= delta:
        return 0, d
    if alpha >= 1.0 and not tight:
        return None, d
    # Shortcut: δ_T ≤ α^T·β for both forms (ε̃_t ≥ ε and θ decreases in ε), so when the loose
    # form needs at most T_max steps the loop below ends before T_max.
    if not tight and alpha > 0 and T_max * math.log(alpha) + math.log(d) > math.log(delta) + 1e-9:
        return None, float(math.exp(T_max * math.log(alpha) + math.log(d)))
    for T in range(1, T_max + 1):
        new = _mc_step(eps, d, r, alpha, tight)
        if new >= d:  # no contraction left (θ rounded to 1): infeasible
            return None, d
        d = new
        if d <= delta:
            return T, d
    return None, d


def mc_steps_needed(
    eps: float,
    delta: float,
    C2: float,
    sigma: float,
    C0: float | None = None,
    sigma0: float = 0.0,
    tight: bool = False,
    T_max: int = 10**6,
) -> int | None:
    """Smallest T with δ_T ≤ δ for model clipping at fixed ε, Theorem 4.2, by iterating
    δ_{t+1} = θ·δ_t (tight=False agrees with eq. (10)); None when over T_max."""
    T_max = _check_steps("T_max", T_max)
    return _mc_search(eps, delta, C2, sigma, C0, sigma0, tight, T_max)[0]


def mc_steps_closed_form(
    eps: float, delta: float, C2: float, sigma: float, C0: float | None = None, sigma0: float = 0.0
) -> int:
    """Eq. (10) of seed 002: T = ⌈(log(1/δ) + log θ_ε(2C0/σ0)) / log(1/θ_ε(2C2/σ))⌉ (≥ 0)."""
    beta = _check_mc(eps, C2, sigma, C0, sigma0)
    check_delta(delta)
    alpha = theta(eps, 2 * C2 / sigma)
    if beta <= delta:
        return 0
    if alpha == 0.0:
        return 1
    if alpha >= 1.0:
        raise PrivacyParameterError("θ_ε(2C2/σ) = 1: model clipping never contracts")
    return max(0, math.ceil((math.log(1 / delta) + math.log(beta)) / math.log(1 / alpha)))


def mc_sigma_needed(
    eps: float,
    delta: float,
    C2: float,
    T: int,
    C0: float | None = None,
    sigma0: float = 0.0,
    tight: bool = False,
) -> float:
    """Smallest σ for which T model-clipping steps reach δ_T ≤ δ, Theorem 4.2 (bisection in
    log σ; δ_T grows with r = 2C2/σ, also for the tight recursion, note 002 §3.4)."""
    T = _check_steps("T", T)
    check_delta(delta)
    beta = _check_mc(eps, C2, 1.0, C0, sigma0)
    if C2 == 0 or beta <= delta:  # nothing left to hide: any σ > 0 will do
        return 0.0

    def ok(s: float) -> bool:
        return mc_delta(eps, T, C2, s, C0, sigma0, tight) <= delta

    lo, hi = C2 * 1e-3, C2
    while ok(lo):
        lo /= 10
    while not ok(hi):
        hi *= 2
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
        if hi / lo < 1 + 1e-12:
            break
    return hi


def plan_model_clipping(
    epsilon: float,
    delta: float,
    C2: float,
    sigma: float | None = None,
    T: int | None = None,
    C0: float | None = None,
    sigma0: float = 0.0,
    tight: bool = False,
    T_max: int = 10**6,
) -> NoisyPlan:
    """Model-clipping plan (Theorem 4.2, ε fixed): given σ, the smallest T; given T, the
    smallest σ; given both, δ_T checked against δ."""
    check_epsilon(epsilon)
    check_delta(delta)
    if sigma is None and T is None:
        raise PrivacyParameterError("give σ (to find T), T (to find σ), or both")
    if T is None:
        assert sigma is not None
        T_max = _check_steps("T_max", T_max)
        steps, reached = _mc_search(epsilon, delta, C2, sigma, C0, sigma0, tight, T_max)
        if steps is None:
            return NoisyPlan(None, float(sigma), None, float(epsilon), reached, False)
        return NoisyPlan(steps, float(sigma), None, float(epsilon), reached, True)
    T = _check_steps("T", T)
    if sigma is None:
        sigma = mc_sigma_needed(epsilon, delta, C2, T, C0, sigma0, tight)
    if sigma == 0.0:  # C2 = 0 (δ_1 = 0) or β ≤ δ already
        reached = 0.0 if C2 == 0 else _check_mc(epsilon, C2, 1.0, C0, sigma0)
    else:
        reached = mc_delta(epsilon, T, C2, sigma, C0, sigma0, tight)
    return NoisyPlan(T, float(sigma), None, float(epsilon), reached, reached <= delta)


# --------------------------------------------------------------------------------------------
# Output perturbation: eq. (1)
# --------------------------------------------------------------------------------------------


def op_sensitivity(C0: float) -> float:
    """L2 sensitivity of output perturbation, eq. (1) of seed 002: two C0-clipped models are
    at most 2·C0 apart."""
    return 2.0 * check_positive("C0", C0, allow_zero=True)


def op_sigma(epsilon: float, delta: float, C0: float) -> float:
    """σ of output perturbation, eq. (1) of seed 002, calibrated with the analytic Gaussian
    mechanism (Balle & Wang 2018) at sensitivity 2·C0: valid for every ε > 0."""
    return sigma_for(op_sensitivity(C0), epsilon, delta)


def op_epsilon(sigma: float, delta: float, C0: float) -> float:
    """ε at δ of output perturbation with noise σ, eq. (1) of seed 002 (analytic Gaussian)."""
    return epsilon_for(op_sensitivity(C0), sigma, delta)


def op_sigma_paper_eq1(epsilon: float, delta: float, C0: float) -> float:
    """The paper's eq. (1), σ = 2·C0·√(2 ln(1.25/δ))/ε (Dwork–Roth Thm A.1), kept ONLY to
    reproduce Tables 9/10. Not a certificate for ε ≥ 1; use op_sigma."""
    check_epsilon(epsilon)
    check_delta(delta)
    return op_sensitivity(C0) * math.sqrt(2 * math.log(1.25 / delta)) / epsilon
