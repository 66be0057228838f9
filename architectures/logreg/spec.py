"""`logreg`: one linear layer on the (optionally clipped) features: a logistic regression."""

from __future__ import annotations

from typing import Any

from architectures.kind import ArchitectureKind, Shapes


def shapes(spec: Any, n_features: int, n_classes: int) -> Shapes:
    return {"1.weight": [n_classes, n_features], "1.bias": [n_classes]}


KIND = ArchitectureKind(name="logreg", parameter_shapes=shapes)
