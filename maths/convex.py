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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch.nn.functional import logsigmoid

from maths.blocks import BLOCK, CPU_BLOCK

UNIT_ROUNDOFF = 2.0**-53


def block_rows(device: torch.device) -> int:
    """Rows per block of a pass on `device`."""
    return CPU_BLOCK if device.type == "cpu" else BLOCK


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
        n = len(X)
        Z = torch.empty(n, math.prod(X.shape[1:]) + 1, dtype=torch.float64, device=X.device)
        T = torch.empty(n, n_classes, dtype=torch.float64, device=X.device)
        _fill(Z, T, X, y, R)
        return cls(Z, T, lam)

    @property
    def n(self) -> int:
        return len(self.Z)

    @property
    def shape(self) -> tuple[int, int]:
        """(k classes, d = p + 1 parameters per class)."""
        return self.T.shape[1], self.Z.shape[1]

    @property
    def device(self) -> torch.device:
        return self.Z.device

    def blocks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(Z, T) in views of at most `block_rows` rows."""
        size = block_rows(self.device)
        for start in range(0, self.n, size):
            yield self.Z[start : start + size], self.T[start : start + size]


@dataclass(frozen=True)
class Streamed:
    """The same objective over rows kept elsewhere in their own dtype (a resident session's
    float32): each pass builds the float64 (Z, T) of one block at a time, so no float64 copy
    of all rows is ever held (1.6 GB at a million rows of 256 features)."""

    rows: Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]  # (X, y) blocks
    n: int
    features: int
    n_classes: int
    R: float
    lam: float
    device: torch.device

    @property
    def shape(self) -> tuple[int, int]:
        return self.n_classes, self.features + 1

    def blocks(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(Z, T) of each block written into one float64 buffer, reused: a block is valid
        until the next is asked for (every pass here sums it first). One buffer, not a fresh
        pair per block with the last one still referenced while the next is built: a
        transient 270 MB of float64 at 65,536 × 257."""
        k, d = self.shape
        size = block_rows(self.device)
        Z_buffer = torch.empty(size, d, dtype=torch.float64, device=self.device)
        T_buffer = torch.empty(size, k, dtype=torch.float64, device=self.device)
        for X, y in self.rows(size):
            m = len(X)
            Z, T = Z_buffer[:m], T_buffer[:m]
            _fill(Z, T, X.to(self.device), y.to(self.device), self.R)
            yield Z, T


def _fill(Z: torch.Tensor, T: torch.Tensor, X: torch.Tensor, y: torch.Tensor, R: float) -> None:
    """Z ← (clip_rows(X, √(R² − 1)), 1) and T ← ±1 one-vs-rest targets, written in place."""
    x = X.flatten(1)  # (k, ...) → (k, d), also for k = 0
    p = x.shape[1]
    features = Z[:, :p]
    features.copy_(x)
    norms = features.norm(dim=1, keepdim=True)
    features.mul_(torch.clamp(math.sqrt(R * R - 1.0) / norms.clamp_min(1e-300), max=1.0))
    Z[:, p] = 1.0
    T.fill_(-1.0)
    T[torch.arange(len(X), device=T.device), y.long().to(T.device)] = 1.0


Objective = Problem | Streamed


def objective(problem: Objective, theta: torch.Tensor) -> torch.Tensor:
    return value_and_gradient(problem, theta)[0]


def gradient(problem: Objective, theta: torch.Tensor) -> torch.Tensor:
    """∇F(Θ), exact up to float64 rounding: (1/n) Cᵀ Z + λΘ with c_ia = −t_ia σ(−m_ia)."""
    total, _ = coefficient_sum(problem.blocks(), theta)
    return total / problem.n + problem.lam * theta


def coefficient_sum(
    blocks: Iterable[tuple[torch.Tensor, torch.Tensor]], theta: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """CᵀZ summed over the blocks' rows, and how many rows there were: one pass, each block's
    coefficients made in place in its margins' buffer (a block stays in cache between the two
    products; see CPU_BLOCK)."""
    total, rows, _ = coefficient_sums(blocks, theta, magnitudes=False)
    return total, rows


def coefficient_sums(
    blocks: Iterable[tuple[torch.Tensor, torch.Tensor]], theta: torch.Tensor, magnitudes: bool
) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """`coefficient_sum`, and with `magnitudes` also, per class, Σ_i |c_ia|·‖z_i‖ and the
    largest ‖z_i‖ (a (k + 1,) vector, last entry the norm): what a rounding bound of the
    |C|ᵀ|Z| form needs, for one matrix-vector product more per block."""
    total = torch.zeros_like(theta)
    theta_t = theta.T.contiguous()
    rows = 0
    sizes = torch.zeros(theta.shape[0] + 1, dtype=theta.dtype, device=theta.device)
    for Z, T in blocks:
        # c = −t·σ(−t·(zΘᵀ)): the buffer holds t·σ(−t·m), and total −= bufferᵀz
        coef = torch.mm(Z, theta_t)
        coef.mul_(T).neg_().sigmoid_().mul_(T)
        total.addmm_(coef.T, Z, alpha=-1.0)
        if magnitudes and len(Z):
            norms = torch.linalg.vector_norm(Z, dim=1)
            sizes[:-1].addmv_(coef.abs().T, norms)
            sizes[-1] = torch.maximum(sizes[-1], norms.max())
        rows += len(Z)
    return total, rows, sizes if magnitudes else None


def value_and_gradient(
    problem: Objective, theta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """F(Θ) and ∇F(Θ) in one pass over the rows."""
    loss = torch.zeros((), dtype=torch.float64, device=theta.device)
    total = torch.zeros_like(theta)
    for Z, T in problem.blocks():
        margins = T * (Z @ theta.T)
        loss += -logsigmoid(margins).sum()
        total += (-T * torch.sigmoid(-margins)).T @ Z
    regulariser = 0.5 * problem.lam * (theta * theta).sum()
    return loss / problem.n + regulariser, total / problem.n + problem.lam * theta


def _coefficients(Z: torch.Tensor, T: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    margins = T * (Z @ theta.T)
    return -T * torch.sigmoid(-margins)


def rounding_bound(problem: Objective, theta: torch.Tensor) -> float:
    """A bound on ‖fl(∇F) − ∇F‖ for the float64 computation above: the sums' error is at
    most γ_m times the sums of absolute terms (Higham 2002, §3.1, §4.2; in any order of
    summation, so blocks too), with the margins' own error carried through σ (Lipschitz ¼).
    m = n + p + 3 covers every chained sum."""
    terms = torch.zeros_like(theta)
    for Z, T in problem.blocks():
        Z_abs = Z.abs()
        C_abs = _coefficients(Z, T, theta).abs() + 0.25 * (Z_abs @ theta.abs().T)
        terms += C_abs.T @ Z_abs
    terms = terms / problem.n + problem.lam * theta.abs()
    m = problem.n + problem.shape[1] + 3
    gamma = m * UNIT_ROUNDOFF / (1.0 - m * UNIT_ROUNDOFF)
    return float(gamma * torch.linalg.norm(terms))


def hessians(problem: Objective, theta: torch.Tensor) -> torch.Tensor:
    """Class Hessians (k, p+1, p+1) at Θ, built in float32 (they precondition Newton steps;
    the certificate never relies on them), a block of rows at a time so no float32 copy of
    every row is made (1.6 GB at a million)."""
    k, d = theta.shape
    H32 = torch.zeros(k, d, d, dtype=torch.float32, device=theta.device)
    for Z, T in problem.blocks():
        s = torch.sigmoid(T * (Z @ theta.T))
        weights = (s * (1.0 - s)).float()
        z32 = Z.float()
        for a in range(k):
            H32[a] += (z32 * weights[:, a : a + 1]).T @ z32
    H = H32.double() / problem.n
    return H + problem.lam * torch.eye(d, dtype=torch.float64, device=theta.device)


def newton_steps(
    problem: Objective, theta: torch.Tensor, H: torch.Tensor, steps: int, tolerance: float = 0.0
) -> tuple[torch.Tensor, int]:
    """Θ ← Θ − H⁻¹∇F(Θ) with one Cholesky factor of H reused; stops early below
    `tolerance`. Returns (Θ, steps taken)."""
    theta, taken, _ = _polish(lambda at: gradient(problem, at), theta, H, steps, tolerance)
    return theta, taken


Measure = Callable[[torch.Tensor], torch.Tensor]
"""Θ ↦ ∇F(Θ), one pass over the rows."""


def _polish(
    measure: Measure, theta: torch.Tensor, H: torch.Tensor, steps: int, tolerance: float
) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """`newton_steps` with the gradient from `measure`; also the gradient at the Θ returned
    when it was measured there (an early stop), so the caller does not measure it again."""
    factor = torch.linalg.cholesky(H)
    for taken in range(steps):
        g = measure(theta)
        if float(torch.linalg.norm(g)) <= tolerance:
            return theta, taken, g
        theta = theta - torch.cholesky_solve(g.unsqueeze(-1), factor).squeeze(-1)
    return theta, steps, None


@dataclass(frozen=True)
class Solution:
    theta: torch.Tensor
    gradient_norm: float
    iterations: int
    newton_steps: int


Curvature = Callable[[torch.Tensor], torch.Tensor]
"""Θ ↦ the (k, d, d) class Hessians the Newton polish preconditions with."""


def solve(
    problem: Objective,
    tolerance: float,
    max_iterations: int,
    start: torch.Tensor | None = None,
    polish_steps: int = 4,
    curvature: Curvature | None = None,
    measure: Measure | None = None,
) -> Solution:
    """Full-batch L-BFGS (strong Wolfe) from `start` (zeros by default), then Newton steps
    with the Hessian on all samples until ‖∇F‖ ≤ tolerance. A warm start tries the Newton
    steps first: near the optimum they converge quadratically where L-BFGS crawls.
    `curvature` makes the polish's Hessian (default: `hessians`, in float32) and `measure`
    its gradients (default: `gradient`): a caller that needs a certified Hessian, or the
    gradient's magnitudes, at the optimum anyway makes them here, in place of these. The
    last gradient measured is always at the solution."""
    curvature = curvature or (lambda theta: hessians(problem, theta))
    measure = measure or (lambda theta: gradient(problem, theta))
    if start is not None:
        theta, steps, g = _polish(measure, start, curvature(start), polish_steps, tolerance)
        norm = float(torch.linalg.norm(g if g is not None else measure(theta)))
        if norm <= tolerance:
            return Solution(theta, norm, 0, steps)
    k, d = problem.shape
    zeros = torch.zeros(k, d, dtype=torch.float64, device=problem.device)
    theta = (start if start is not None else zeros).clone()
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
        # the analytic gradient, one blocked pass (no autograd graph over every row)
        loss, theta.grad = value_and_gradient(problem, theta.detach())
        return loss

    optimizer.step(closure)
    iterations = int(optimizer.state[optimizer._params[0]].get("n_iter", 0))
    result = theta.detach().clone()
    result, polished, g = _polish(measure, result, curvature(result), polish_steps, tolerance)
    norm = float(torch.linalg.norm(g if g is not None else measure(result)))
    return Solution(result, norm, iterations, polished)
