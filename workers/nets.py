"""Architectures built from a JSON spec (never from uploaded code); deterministic layers only."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def build_net(spec: dict[str, Any], n_features: int, n_classes: int) -> nn.Module:
    """`logreg`: one linear layer; `mlp`: linear layers with the chosen activation."""
    kind = spec.get("type")
    if kind == "logreg":
        return nn.Sequential(nn.Flatten(), nn.Linear(n_features, n_classes))
    if kind == "mlp":
        layers: list[nn.Module] = [nn.Flatten()]
        width = n_features
        for hidden in spec.get("hidden", [64, 64]):
            layers += [nn.Linear(width, int(hidden)), ACTIVATIONS[spec.get("activation", "relu")]()]
            if spec.get("dropout", 0.0) > 0:
                layers.append(nn.Dropout(spec["dropout"]))
            width = int(hidden)
        layers.append(nn.Linear(width, n_classes))
        return nn.Sequential(*layers)
    raise ValueError(f"unknown architecture type {kind!r}")


def state_of(net: nn.Module) -> dict[str, torch.Tensor]:
    """A detached, contiguous copy of the parameters (safetensors-ready)."""
    return {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state[k].reshape(-1) for k in sorted(state)])
