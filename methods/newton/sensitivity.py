"""Worst-case L2 sensitivity Δ = sup ‖unlearned − retrained‖ of certified Newton (seed 004,
Proposition 4.1, Eq. 11) in its corrected form (with the condition number (λ + L)/(λ + λ_min)
in the LiSSA term), and the pre-correction form only to reproduce the paper's Table 3. Feed Δ
to `app.privacy.gaussian.sigma_for` (the analytic Gaussian). The method's own accountant
(theorem-specific bounds live with their method; app/privacy keeps the mechanisms).
"""

from __future__ import annotations

import math

from app.privacy.validate import PrivacyParameterError, check_finite, check_positive

__all__ = ["lissa_min_depth", "newton_sensitivity", "newton_sensitivity_paper"]


def _newton_common(
    C: float,
    M: float,
    L: float,
    lam: float,
    lam_min: float,
    G: float,
    d: float | None,
    rho: float | None,
    sqrt_log_d_over_rho: float | None,
) -> tuple[float, float]:
    """Checks the arguments; returns (λ + λ_min, √ln(d/ρ))."""
    check_positive("C", C)
    check_positive("M", M, allow_zero=True)
    check_positive("L", L, allow_zero=True)
    check_positive("λ", lam, allow_zero=True)
    check_positive("G", G, allow_zero=True)
    lam_min = check_finite("λ_min", lam_min)
    k = lam + lam_min
    if k <= 0:
        raise PrivacyParameterError(f"need λ + λ_min > 0, got λ = {lam}, λ_min = {lam_min}")
    if sqrt_log_d_over_rho is not None:
        if d is not None or rho is not None:
            raise PrivacyParameterError("give either √ln(d/ρ) or (d, ρ), not both")
        return k, check_positive("√ln(d/ρ)", sqrt_log_d_over_rho)
    if d is None or rho is None:
        raise PrivacyParameterError("give (d, ρ) or √ln(d/ρ)")
    check_positive("d", d)
    if not (isinstance(rho, int | float) and math.isfinite(rho) and 0 < rho < 1):
        raise PrivacyParameterError(f"ρ (LiSSA failure probability) must be in (0, 1), got {rho!r}")
    if d <= rho:
        raise PrivacyParameterError(f"need d > ρ so that ln(d/ρ) > 0, got d = {d}, ρ = {rho}")
    return k, math.sqrt(math.log(d / rho))


def lissa_min_depth(L: float, lam: float, lam_min: float) -> float:
    """Seed 004 corrected Thm 3.6 / Prop 4.1 condition on the LiSSA depth:
    s ≥ 2κ·ln κ with κ = (L + λ)/(λ + λ_min)."""
    check_positive("L", L, allow_zero=True)
    check_positive("λ", lam, allow_zero=True)
    k = lam + check_finite("λ_min", lam_min)
    if k <= 0:
        raise PrivacyParameterError(f"need λ + λ_min > 0, got λ = {lam}, λ_min = {lam_min}")
    kappa = (L + lam) / k
    return max(0.0, 2 * kappa * math.log(kappa)) if kappa > 0 else 0.0


def newton_sensitivity(
    C: float,
    M: float,
    L: float,
    lam: float,
    lam_min: float,
    G: float = 0.0,
    *,
    d: float | None = None,
    rho: float | None = None,
    sqrt_log_d_over_rho: float | None = None,
    s: int | None = None,
) -> float:
    """Seed 004 Proposition 4.1 (Eq. 11), corrected: Δ = (2C(MC + λ) + G)/(λ + λ_min)
    + (16√ln(d/ρ)·(λ + L)/(λ + λ_min) + 1/16)·(2LC + G); G = 0 is Theorem 3.6 (Eq. 9).

    Arguments (note 004 §1, §3.5): C the parameter-norm bound (PGD onto ‖w‖ ≤ C), M the Hessian
    Lipschitz constant, L the gradient Lipschitz constant, lam = λ the local convex coefficient,
    lam_min = λ_min the smallest Hessian eigenvalue of the retain loss at w* (may be < 0, with
    λ + λ_min > 0), G the residual-gradient bound (non-convergence), d the parameter count and
    rho = ρ the LiSSA failure probability (or sqrt_log_d_over_rho = √ln(d/ρ) directly), s the
    LiSSA depth, checked against `lissa_min_depth` when given. Holds with probability 1 − ρ.
    """
    k, root = _newton_common(C, M, L, lam, lam_min, G, d, rho, sqrt_log_d_over_rho)
    if s is not None and s < lissa_min_depth(L, lam, lam_min):
        raise PrivacyParameterError(
            f"LiSSA depth s = {s} below 2κ ln κ = {lissa_min_depth(L, lam, lam_min):.4g}"
        )
    exact = (2 * C * (M * C + lam) + G) / k
    return exact + (16 * root * (lam + L) / k + 1 / 16) * (2 * L * C + G)


def newton_sensitivity_paper(
    C: float,
    M: float,
    L: float,
    lam: float,
    lam_min: float,
    G: float = 0.0,
    *,
    d: float | None = None,
    rho: float | None = None,
    sqrt_log_d_over_rho: float | None = None,
) -> float:
    """Seed 004 Proposition 4.1 (Eq. 11) BEFORE the authors' correction (no (λ + L) factor in
    the LiSSA term): kept only to reproduce the paper's Table 3. Not a valid Δ; use
    newton_sensitivity."""
    k, root = _newton_common(C, M, L, lam, lam_min, G, d, rho, sqrt_log_d_over_rho)
    exact = (2 * C * (M * C + lam) + G) / k
    return exact + (16 * root / k + 1 / 16) * (2 * L * C + G)
