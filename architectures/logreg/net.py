"""`logreg` in torch: Flatten (or ClipFeatures when convex_head set R) then one Linear layer;
scored straight from the released weights, without building the module."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from app.core.specs import LogRegSpec
from maths.ensemble import count_shards, linear_scorer
from maths.nets import ClipFeatures, clipped_linear


def _first(spec: LogRegSpec) -> nn.Module:
    return nn.Flatten() if spec.feature_norm is None else ClipFeatures(spec.feature_norm)


def build(spec: LogRegSpec, n_features: int, n_classes: int) -> nn.Module:
    return nn.Sequential(_first(spec), nn.Linear(n_features, n_classes, device="cpu"))


def scorer(
    spec: LogRegSpec,
    state: dict[str, torch.Tensor],
    n_features: int,
    n_classes: int,
    device: torch.device,
    aggregation: str,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """The layer's own functional forward (building and loading the module was a millisecond
    of every update's accuracies); a sharded model's members stacked (maths/ensemble.py)."""
    if count_shards(state):
        return linear_scorer(spec, state, aggregation, device)
    W, b = (state[f"1.{name}"].to(device, torch.float32) for name in ("weight", "bias"))
    if spec.feature_norm is None:
        return lambda x: nn.functional.linear(x.flatten(1), W, b)
    radius = ClipFeatures(spec.feature_norm).radius
    return lambda x: clipped_linear(x.flatten(1), W, b, radius)
