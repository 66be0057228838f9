"""`random_features` in torch: Flatten, the frozen features, one trained Linear layer."""

from __future__ import annotations

import torch
from torch import nn

from app.core.specs import RandomFeaturesSpec


def build(spec: RandomFeaturesSpec, n_features: int, n_classes: int) -> nn.Module:
    features = RandomFeatures(n_features, spec)
    return nn.Sequential(nn.Flatten(), features, nn.Linear(spec.width, n_classes, device="cpu"))


class RandomFeatures(nn.Module):
    """φ(x) = act(A x + b) with A, b frozen buffers drawn from the spec's own seed (not the
    training seed): every build of the architecture has the same features."""

    def __init__(self, n_features: int, spec: RandomFeaturesSpec) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(spec.seed)
        cpu = gen.device  # drawn on CPU: the same features on every device
        weight = torch.randn(spec.width, n_features, generator=gen, device=cpu)
        weight = weight * (spec.scale / n_features**0.5)
        self.weight: torch.Tensor
        self.bias: torch.Tensor
        self.register_buffer("weight", weight)
        bias = torch.randn(spec.width, generator=gen, device=cpu) * spec.bias_scale
        self.register_buffer("bias", bias)
        self.activation = spec.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = nn.functional.linear(x, self.weight.to(x.dtype), self.bias.to(x.dtype))
        if self.activation == "relu":
            return torch.relu(z)
        return torch.tanh(z) if self.activation == "tanh" else torch.cos(z)
