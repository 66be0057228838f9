"""Global-norm clipping, the one projection every method shares: Π_C(x) = x·min(1, C/‖x‖)
over the whole parameter vector (note 002 §1.1, note 004 §2.1)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

ModelState = dict[str, torch.Tensor]


def global_norm(tensors: Iterable[torch.Tensor]) -> float:
    """‖x‖ of the concatenation of `tensors`, accumulated in float64 on their device (one
    host sync)."""
    total: torch.Tensor | None = None
    for t in tensors:
        square = (t.double() ** 2).sum()
        total = square if total is None else total + square
    return 0.0 if total is None else float(torch.sqrt(total))


def projection_scale(norm: float, radius: float) -> float:
    """min(1, C/‖x‖): the factor that projects a vector of this norm onto the C ball."""
    return radius / norm if norm > radius else 1.0


def clip_vector(x: torch.Tensor, radius: float) -> torch.Tensor:
    """Π_C for one flat vector (gradients, or a model as a vector)."""
    scale = projection_scale(float(x.norm()), radius)
    return x * scale if scale != 1.0 else x


def clip_to_ball(state: ModelState, radius: float) -> ModelState:
    """Π_C over a whole state dict, biases included."""
    scale = projection_scale(global_norm(state.values()), radius)
    return {k: (v * scale).contiguous() for k, v in state.items()}


@torch.no_grad()
def project_parameters_(net: nn.Module, radius: float) -> None:
    """Π_C in place on a network's parameters (projected SGD)."""
    scale = projection_scale(global_norm(net.parameters()), radius)
    if scale != 1.0:
        for p in net.parameters():
            p.mul_(scale)
