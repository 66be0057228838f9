"""The linear algebra of exact min-norm unlearning (seed 001, Theorem 4.1), with no database.

A linear model θ (C × p) on features φ(x) ∈ R^p (the bias a constant coordinate) is trained to
the minimum-norm interpolator θᵀ = Φᵀ K⁻¹ Y, K = Φ Φᵀ the Gram matrix of the n < p training
rows. Removing samples solves the retained rows' labels, θ_rᵀ = Φ_rᵀ K_r⁻¹ Y_r: when θ interpolated
them this equals P_{S_r} θᵀ = Φ_rᵀ K_r⁻¹ Φ_r θᵀ, the projection of Theorem 4.1, but it stays
the retrain when it did not (dependent rows with conflicting labels).

K_r⁻¹ comes from the stored K⁻¹ by the principal-submatrix identity
K_r⁻¹ = (K⁻¹)_rr − (K⁻¹)_rf ((K⁻¹)_ff)⁻¹ (K⁻¹)_fr, O(n²·m) for m removed rows instead of a
fresh O(p·n²) Gram matrix and O(n³) factor. Rounding in the downdated inverse is removed by
iterative refinement against the retained rows themselves (O(p·n) per step), and the result is
checked by its interpolation residual; a fresh solve is the fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MinNormFit:
    """θ (C × p), the Gram inverse of its rows (None when they are linearly dependent),
    its numerical rank, and the relative interpolation residual ‖Φθᵀ − Y‖/‖Y‖."""

    theta: torch.Tensor
    gram_inverse: torch.Tensor | None
    rank: int
    residual: float


def with_bias(features: torch.Tensor) -> torch.Tensor:
    """Φ = [φ(x), 1] in float64: the bias is the constant coordinate."""
    ones = torch.ones(len(features), 1, dtype=torch.float64, device=features.device)
    return torch.cat([features.double(), ones], dim=1)


def gram_inverse(phi: torch.Tensor, rank_tolerance: float) -> torch.Tensor | None:
    """K⁻¹ for K = Φ Φᵀ, or None when K is numerically singular: its Cholesky fails or a pivot
    falls below `rank_tolerance` × the largest diagonal entry (dependent rows)."""
    gram = phi @ phi.T
    factor, info = torch.linalg.cholesky_ex(gram)
    if int(info) != 0:
        return None
    pivots = factor.diagonal() ** 2
    if float(pivots.min()) < rank_tolerance * float(gram.diagonal().max()):
        return None
    return torch.cholesky_inverse(factor)


def fit(phi: torch.Tensor, targets: torch.Tensor, rank_tolerance: float) -> MinNormFit:
    """The minimum-norm solution of Φ θᵀ = Y: through K⁻¹ when the rows are independent,
    else the SVD least squares (gelsd) with that rank tolerance (no inverse kept)."""
    inverse = gram_inverse(phi, rank_tolerance)
    if inverse is None:
        return _lstsq(phi, targets, rank_tolerance)
    return solve_with(phi, inverse, targets, steps=1)


def _lstsq(phi: torch.Tensor, targets: torch.Tensor, rank_tolerance: float) -> MinNormFit:
    rcond = rank_tolerance**0.5  # on singular values of Φ, the square roots of K's
    solution = torch.linalg.lstsq(phi.cpu(), targets.cpu(), rcond=rcond, driver="gelsd")
    theta = solution.solution.T.to(phi.device)
    rank = int(solution.rank) if solution.rank.numel() else len(phi)
    return MinNormFit(theta, None, rank, interpolation_residual(phi, theta, targets))


def downdate(inverse: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """K_r⁻¹ from K⁻¹ by the principal-submatrix identity (`keep`: the retained rows)."""
    gone = ~keep
    if not bool(gone.any()):
        return inverse
    rr = inverse[keep][:, keep]
    rf = inverse[keep][:, gone]
    ff = inverse[gone][:, gone]
    factor = torch.linalg.cholesky(ff)
    return rr - rf @ torch.cholesky_solve(rf.T.contiguous(), factor)


def extend(inverse: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor | None:
    """(K')⁻¹ of the rows [old; new] from K⁻¹ of `old`, a rank-k update by the Schur complement
    S = ΦₙΦₙᵀ − BᵀK⁻¹B, B = ΦₒΦₙᵀ: O(n²k + nkp). None when S is not positive
    definite in float64 (the new rows depend on the others: a fresh solve is needed)."""
    B = old @ new.T
    KB = inverse @ B
    schur = new @ new.T - B.T @ KB
    factor, info = torch.linalg.cholesky_ex(0.5 * (schur + schur.T))
    if bool((info != 0).any()):
        return None
    schur_inverse = torch.cholesky_inverse(factor)
    corner = -KB @ schur_inverse
    top = inverse - corner @ KB.T
    return torch.cat([torch.cat([top, corner], 1), torch.cat([corner.T, schur_inverse], 1)], 0)


def refine(
    phi: torch.Tensor,
    inverse: torch.Tensor,
    theta: torch.Tensor,
    targets: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """Iterative refinement of θᵀ = Φᵀβ towards Φθᵀ = Y with K⁻¹ as the preconditioner; θ
    stays in the row span of Φ, so the interpolator it converges to is the minimum-norm one."""
    for _ in range(steps):
        correction = inverse @ (targets - phi @ theta.T)
        theta = theta + correction.T @ phi
    return theta


def solve_with(
    phi: torch.Tensor, inverse: torch.Tensor, targets: torch.Tensor, steps: int
) -> MinNormFit:
    """θᵀ = Φᵀ K⁻¹ Y with a given K⁻¹ (the downdated one), refined against Φ and Y: the
    minimum-norm interpolator of these rows' targets."""
    theta = (inverse @ targets).T @ phi
    theta = refine(phi, inverse, theta, targets, steps)
    return MinNormFit(theta, inverse, len(phi), interpolation_residual(phi, theta, targets))


def interpolation_residual(phi: torch.Tensor, theta: torch.Tensor, targets: torch.Tensor) -> float:
    """‖Φθᵀ − Y‖_F / ‖Y‖_F, in float64."""
    scale = float(torch.linalg.norm(targets)) or 1.0
    return float(torch.linalg.norm(phi @ theta.T - targets)) / scale
