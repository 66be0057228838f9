"""One-vs-rest L2-regularised logistic regression in float64: objective, gradient, Hessian,
solver and the float64 rounding bound of the gradient (convex_head, Guo et al. 2020).

Parameters Θ are a (k, p+1) matrix: row a is class a's weights, the last column its bias, and
features are z = (x, 1) scaled so that ‖z‖ ≤ R. Class a's objective is
F_a(θ) = (1/n) Σ_i log(1 + exp(−t_ia θ·z_i)) + (λ/2)‖θ‖², t_ia = ±1; F = Σ_a F_a is
λ-strongly convex, so ‖Θ − Θ*‖ ≤ ‖∇F(Θ)‖ / λ.

Everything runs on the device of the features given to `Problem.of` (float64 on a GPU too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn.functional import logsigmoid

UNIT_ROUNDOFF = 2.0**-53
HESSIAN_BLOCK = 65_536  # rows per block of the float32 Hessian


@dataclass(frozen=True)
class Problem:
    """Clipped features with the bias coordinate, ±1 targets per class, and λ."""

    Z: torch.Tensor  # (n, p+1) float64
    T: torch.Tensor  # (n, k) float64, +1 for the sample's class, −1 elsewhere
    lam: float

    @classmethod
    def of(cls, X: torch.Tensor, y: torch.Tensor, n_classes: int, R: float, lam: float) -> Problem:
        """Built in place (one float64 copy of X): the same values as
        `cat([clip_rows(X.double(), √(R² − 1)), 1])`, in a third of the passes."""
        x = X.reshape(len(X), -1)
        n, p = x.shape
        device = x.device
        Z = torch.empty(n, p + 1, dtype=torch.float64, device=device)
        features = Z[:, :p]
        features.copy_(x)
        norms = features.norm(dim=1, keepdim=True)
        features.mul_(torch.clamp(math.sqrt(R * R - 1.0) / norms.clamp_min(1e-300), max=1.0))
        Z[:, p] = 1.0
        T = torch.full((n, n_classes), -1.0, dtype=torch.float64, device=device)
        T[torch.arange(n, device=device), y.long().to(device)] = 1.0
        return cls(Z, T, lam)

    @property
    def n(self) -> int:
        return len(self.Z)


def objective(problem: Problem, theta: torch.Tensor) -> torch.Tensor:
    margins = problem.T * (problem.Z @ theta.T)
    return -logsigmoid(margins).sum() / problem.n + 0.5 * problem.lam * (theta * theta).sum()


def gradient(problem: Problem, theta: torch.Tensor) -> torch.Tensor:
    """∇F(Θ), exact up to float64 rounding: (1/n) Cᵀ Z + λΘ with c_ia = −t_ia σ(−m_ia)."""
    return _coefficients(problem, theta).T @ problem.Z / problem.n + problem.lam * theta


def _coefficients(problem: Problem, theta: torch.Tensor) -> torch.Tensor:
    margins = problem.T * (problem.Z @ theta.T)
    return -problem.T * torch.sigmoid(-margins)


def rounding_bound(problem: Problem, theta: torch.Tensor) -> float:
    """A bound on ‖fl(∇F) − ∇F‖ for the float64 computation above: the sums' error is at
    most γ_m times the sums of absolute terms (Higham 2002, §3.1, §4.2), with the margins'
    own error carried through σ (Lipschitz ¼). m = n + p + 3 covers every chained sum."""
    Z_abs = problem.Z.abs()
    C_abs = _coefficients(problem, theta).abs() + 0.25 * (Z_abs @ theta.abs().T)
    terms = C_abs.T @ Z_abs / problem.n + problem.lam * theta.abs()
    m = problem.n + problem.Z.shape[1] + 3
    gamma = m * UNIT_ROUNDOFF / (1.0 - m * UNIT_ROUNDOFF)
    return float(gamma * torch.linalg.norm(terms))


def hessians(
    problem: Problem, theta: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Class Hessians (k, p+1, p+1) at Θ from the samples `rows` (all by default), built in
    float32 (they precondition Newton steps; the certificate never relies on them), a block of
    rows at a time so no float32 copy of every row is made (issue 28: 1.6 GB at a million)."""
    if rows is not None:
        rows = rows.to(problem.Z.device)
    Z = problem.Z if rows is None else problem.Z[rows]
    T = problem.T if rows is None else problem.T[rows]
    k, d = theta.shape
    H32 = torch.zeros(k, d, d, dtype=torch.float32, device=Z.device)
    for start in range(0, len(Z), HESSIAN_BLOCK):
        z, t = Z[start : start + HESSIAN_BLOCK], T[start : start + HESSIAN_BLOCK]
        s = torch.sigmoid(t * (z @ theta.T))
        weights = (s * (1.0 - s)).float()
        z32 = z.float()
        for a in range(k):
            H32[a] += (z32 * weights[:, a : a + 1]).T @ z32
    H = H32.double() / len(Z)
    return H + problem.lam * torch.eye(d, dtype=torch.float64, device=Z.device)


def newton_steps(
    problem: Problem, theta: torch.Tensor, H: torch.Tensor, steps: int, tolerance: float = 0.0
) -> tuple[torch.Tensor, int]:
    """Θ ← Θ − H⁻¹∇F(Θ) with one Cholesky factor of H reused; stops early below
    `tolerance`. Returns (Θ, steps taken)."""
    factor = torch.linalg.cholesky(H)
    for taken in range(steps):
        g = gradient(problem, theta)
        if float(torch.linalg.norm(g)) <= tolerance:
            return theta, taken
        theta = theta - torch.cholesky_solve(g.unsqueeze(-1), factor).squeeze(-1)
    return theta, steps


@dataclass(frozen=True)
class Solution:
    theta: torch.Tensor
    gradient_norm: float
    iterations: int
    newton_steps: int


def solve(
    problem: Problem,
    tolerance: float,
    max_iterations: int,
    start: torch.Tensor | None = None,
    polish_steps: int = 4,
) -> Solution:
    """Full-batch L-BFGS (strong Wolfe) from `start` (zeros by default), then Newton steps
    with the Hessian on all samples until ‖∇F‖ ≤ tolerance. A warm start tries the Newton
    steps first: near the optimum they converge quadratically where L-BFGS crawls."""
    if start is not None:
        theta, steps = newton_steps(
            problem, start, hessians(problem, start), polish_steps, tolerance
        )
        norm = float(torch.linalg.norm(gradient(problem, theta)))
        if norm <= tolerance:
            return Solution(theta, norm, 0, steps)
    k, d = problem.T.shape[1], problem.Z.shape[1]
    zeros = torch.zeros(k, d, dtype=torch.float64, device=problem.Z.device)
    theta = (start if start is not None else zeros).clone()
    theta.requires_grad_(True)
    optimizer = torch.optim.LBFGS(
        [theta],
        lr=1.0,
        max_iter=max_iterations,
        tolerance_grad=max(tolerance, 1e-9) / math.sqrt(k * d),
        tolerance_change=1e-15,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = objective(problem, theta)
        loss.backward()
        return loss

    optimizer.step(closure)
    iterations = int(optimizer.state[optimizer._params[0]].get("n_iter", 0))
    result = theta.detach()
    result, polished = newton_steps(
        problem, result, hessians(problem, result), polish_steps, tolerance
    )
    norm = float(torch.linalg.norm(gradient(problem, result)))
    return Solution(result, norm, iterations, polished)
