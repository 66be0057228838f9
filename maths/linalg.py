"""Extreme eigenvalues of a symmetric operator by power iteration, for the ρ of seed 003
(Lemma 2) and the measured ‖H‖, λ_min of seed 004."""

from __future__ import annotations

from collections.abc import Callable

import torch

Operator = Callable[[torch.Tensor], torch.Tensor]


def dominant_eigenvalue(
    op: Operator,
    d: int,
    iters: int,
    gen: torch.Generator,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> float:
    """The Rayleigh quotient vᵀAv after `iters` power-iteration steps from a random start.
    The start is drawn by `gen` on its own device, then moved to `device` (the operator's;
    default: the generator's), so a seeded generator gives the same start on every device."""
    v = torch.randn(d, generator=gen, dtype=dtype, device=gen.device).to(device or gen.device)
    v /= v.norm()
    value = 0.0
    for _ in range(iters):
        w = op(v)
        value = float(v @ w)
        norm = float(w.norm())
        if norm == 0:
            return 0.0
        v = w / norm
    return value


def extreme_eigenvalues(
    op: Operator,
    d: int,
    iters: int,
    gen: torch.Generator,
    dtype: torch.dtype = torch.float32,
    device: torch.device | None = None,
) -> tuple[float, float]:
    """(λ_max, λ_min): λ_min by power iteration on the shifted operator |λ_max|·I − A; the
    vectors live on `device` (the operator's; default: the generator's)."""
    lam_max = dominant_eigenvalue(op, d, iters, gen, dtype, device)
    shift = abs(lam_max)
    if shift == 0:
        return lam_max, 0.0
    lam_min = lam_max - dominant_eigenvalue(
        lambda v: shift * v - op(v), d, iters, gen, dtype, device
    )
    return lam_max, lam_min
