"""Fresh Gaussian noise for releases, and the guard against releases drowned in it."""

from __future__ import annotations

import math
import secrets

import torch

from methods.compute import ModelState, TargetInfeasible


def secure_generator() -> torch.Generator:
    """A CPU generator seeded from the OS's secure source; the seed is never stored. Used for
    every random draw of an update (noise, LiSSA batches, power-iteration starts): the draws
    are made on CPU and moved to the worker's device, so a generator seeded the same way
    gives the same draws on every device."""
    return torch.Generator().manual_seed(secrets.randbits(63))


def draw_gaussian(
    shape: torch.Size | tuple[int, ...],
    gen: torch.Generator,
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """N(0, I) of this shape, sampled by `gen` on its own device (CPU) and moved to `device`:
    reproducible across devices for a seeded generator (a CUDA draw would differ)."""
    return torch.randn(shape, generator=gen, dtype=dtype, device=gen.device).to(device)


def add_gaussian(state: ModelState, sigma: float, gen: torch.Generator) -> ModelState:
    """x + N(0, σ²I) on every coordinate, biases included, on the device of each tensor."""
    return {
        k: (v + sigma * draw_gaussian(v.shape, gen, v.dtype, v.device)).contiguous()
        for k, v in state.items()
    }


def check_relative_noise(
    sigma: float, sensitivity: float, d: int, weights_norm: float, limit: float | None
) -> None:
    """Refuse (TargetInfeasible, hence an exact retrain) a release whose expected noise norm
    σ√d exceeds `limit` times the weights' norm: it would be useless."""
    ratio = sigma * math.sqrt(d) / max(weights_norm, 1e-12)
    if limit is not None and ratio > limit:
        raise TargetInfeasible(
            f"the certified noise (σ={sigma:.4g}, Δ={sensitivity:.4g}) "
            f"would be {ratio:.3g}× the weights' norm, above "
            f"max_relative_noise={limit:g}"
        )
