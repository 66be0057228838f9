"""`random_features`: a linear model on frozen random features φ(x) = act(A x + b) (seed
001's two-layer setting with A fixed); A and b are buffers, counted as parameters of the
file but never trained."""

from __future__ import annotations

from typing import Any

from architectures.kind import ArchitectureKind, Shapes


def shapes(spec: Any, n_features: int, n_classes: int) -> Shapes:
    """1.*: the frozen first layer (buffers); 2.*: the trained layer."""
    width = spec.width
    return {
        "1.weight": [width, n_features],
        "1.bias": [width],
        "2.weight": [n_classes, width],
        "2.bias": [n_classes],
    }


KIND = ArchitectureKind(
    name="random_features",
    parameter_shapes=shapes,
    activation_widths=lambda spec, d, c: [d, c, spec.width],
    feature_width=lambda spec, d: spec.width + 1,
)
