"""Shared tensor helpers for noisy releases: global-norm clipping and fresh Gaussian noise."""

from __future__ import annotations

import secrets

import torch

from workers.methods.base import ModelState


def global_norm(state: ModelState) -> float:
    return float(torch.sqrt(sum((v.double() ** 2).sum() for v in state.values())))


def clip_vector(x: torch.Tensor, radius: float) -> torch.Tensor:
    """Π_C(x) = x·min(1, C/‖x‖) for one flat vector (gradients, or a model as a vector)."""
    norm = float(x.norm())
    return x * (radius / norm) if norm > radius else x


def clip_to_ball(state: ModelState, radius: float) -> ModelState:
    """Π_C(x) = x·min(1, C/‖x‖) over the whole parameter vector (seed 002 §1.1)."""
    scale = min(1.0, radius / max(global_norm(state), 1e-30))
    return {k: (v * scale).contiguous() for k, v in state.items()}


def secure_generator() -> torch.Generator:
    """A generator seeded from the OS's secure source; the seed is never stored."""
    return torch.Generator().manual_seed(secrets.randbits(63))


def add_gaussian(state: ModelState, sigma: float, gen: torch.Generator) -> ModelState:
    """x + N(0, σ²I) on every coordinate, biases included."""
    return {
        k: (v + sigma * torch.randn(v.shape, generator=gen, dtype=v.dtype)).contiguous()
        for k, v in state.items()
    }
