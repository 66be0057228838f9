"""Maths of certified Newton unlearning (seed 004): full-data gradients, LiSSA inverse-Hessian-
vector products with torch.func, and power-iteration checks on the declared constants.

Everything runs on the device of `w` and the data; the random mini-batches and power-iteration
starts are drawn by the (CPU) generator and moved there."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import grad, jvp, vmap

from maths.linalg import extreme_eigenvalues
from maths.nets import FlatModel


class LissaDiverged(RuntimeError):
    def __init__(self, step: int, norm: float, bound: float) -> None:
        super().__init__(f"‖P_j‖ = {norm:.4g} > {bound:.4g} at step {step}")
        self.step, self.norm, self.bound = step, norm, bound


@dataclass
class LissaResult:
    ihvp: torch.Tensor
    max_ratio: float  # max_j ‖P_j‖ / ((j+1)‖v‖): ≤ 1 while the recursion contracts


def objective(model: FlatModel, weight_decay: float):
    """Mean cross-entropy plus the training L2 term: the loss whose optimum retraining finds."""

    def loss(w: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ce = nn.functional.cross_entropy(model.logits(w, X), y)
        return ce + 0.5 * weight_decay * (w @ w)

    return loss


def mean_gradient(
    model: FlatModel,
    w: torch.Tensor,
    X: torch.Tensor,
    y: torch.Tensor,
    weight_decay: float,
    chunk: int = 4096,
) -> torch.Tensor:
    """∇L(w, D) over all rows, in chunks weighted by size."""
    loss = objective(model, 0.0)
    total = torch.zeros_like(w)
    for s in range(0, len(y), chunk):
        total += grad(loss)(w, X[s : s + chunk], y[s : s + chunk]) * len(y[s : s + chunk])
    return total / max(len(y), 1) + weight_decay * w


def lissa(
    model: FlatModel,
    w: torch.Tensor,
    v: torch.Tensor,
    X: torch.Tensor,
    y: torch.Tensor,
    *,
    lam: float,
    scale: float,
    depth: int,
    chains: int,
    batch: int,
    weight_decay: float,
    gen: torch.Generator,
    guard: float,
) -> LissaResult:
    """(H + λI)⁻¹v by the stochastic LiSSA recursion (seed 004 Eq. 8, Algorithm 1):
    P_0 = v, P_j = v + (I − (H_j + λI)/H_sc)·P_{j−1}, result mean over chains of P_s/H_sc,
    with H_j the Hessian of a mini-batch drawn with replacement. Chains run in parallel (vmap).
    The Neumann partial sums satisfy ‖P_j‖ ≤ (j+1)‖v‖ while the recursion contracts; past
    `guard` times that, it is diverging and LissaDiverged is raised."""
    loss = objective(model, weight_decay)

    def hvp(p: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return jvp(lambda wv: grad(loss)(wv, xb, yb), (w,), (p,))[1] + lam * p

    batched = vmap(hvp)
    P = v.expand(chains, -1).clone()
    vnorm = float(v.norm()) or 1.0
    worst = 0.0
    full = batch >= len(y)  # the whole retained set: the deterministic Neumann series
    for j in range(1, depth + 1):
        if full:
            P = v + P - vmap(hvp, in_dims=(0, None, None))(P, X, y) / scale
        else:
            idx = torch.randint(len(y), (chains, batch), generator=gen, device=gen.device)
            idx = idx.to(X.device)
            P = v + P - batched(P, X[idx], y[idx]) / scale
        if j % 10 == 0 or j == depth:
            norm = float(P.norm(dim=1).max())
            ratio = norm / ((j + 1) * vnorm)
            worst = max(worst, ratio)
            if not math.isfinite(norm) or ratio > guard:
                raise LissaDiverged(j, norm, guard * (j + 1) * vnorm)
    return LissaResult(ihvp=(P / scale).mean(0), max_ratio=worst)


def hessian_extremes(
    model: FlatModel,
    w: torch.Tensor,
    X: torch.Tensor,
    y: torch.Tensor,
    weight_decay: float,
    iters: int,
    gen: torch.Generator,
    max_rows: int = 2048,
) -> tuple[float, float]:
    """(λ_max, λ_min) of ∇²L(w, D_r) by power iteration on HVPs (λ_min by shifting)."""
    rows = torch.randperm(len(y), generator=gen, device=gen.device)[:max_rows].to(X.device)
    Xs, ys = X[rows], y[rows]
    loss = objective(model, weight_decay)

    def hvp(p: torch.Tensor) -> torch.Tensor:
        return jvp(lambda wv: grad(loss)(wv, Xs, ys), (w,), (p,))[1]

    return extreme_eigenvalues(hvp, w.numel(), iters, gen, w.dtype, w.device)
