"""`mlp` in torch: Flatten, then Linear and the activation per hidden layer, then Linear."""

from __future__ import annotations

from torch import nn

from app.core.specs import MLPSpec

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def build(spec: MLPSpec, n_features: int, n_classes: int) -> nn.Module:
    layers: list[nn.Module] = [nn.Flatten()]
    width = n_features
    for hidden in spec.hidden:
        layers += [nn.Linear(width, hidden, device="cpu"), ACTIVATIONS[spec.activation]()]
        width = hidden
    layers.append(nn.Linear(width, n_classes, device="cpu"))
    return nn.Sequential(*layers)
