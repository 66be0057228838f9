"""`mlp`: linear layers with one activation between them."""

from __future__ import annotations

from typing import Any

from architectures.kind import ArchitectureKind, Shapes


def shapes(spec: Any, n_features: int, n_classes: int) -> Shapes:
    """`{index}.weight`/`.bias` of each Linear in the Sequential (Flatten at 0, an
    activation after each hidden layer)."""
    out: Shapes = {}
    index, width = 1, n_features
    for hidden in spec.hidden:
        out[f"{index}.weight"], out[f"{index}.bias"] = [hidden, width], [hidden]
        index += 2  # Linear, activation
        width = hidden
    out[f"{index}.weight"], out[f"{index}.bias"] = [n_classes, width], [n_classes]
    return out


KIND = ArchitectureKind(
    name="mlp",
    parameter_shapes=shapes,
    activation_widths=lambda spec, d, c: [d, c, *spec.hidden],
)
