"""`topic_head`: a classifier on a topic model (seed 000 §A.6), served as B = n·A_S w
(vocabulary × classes) plus a bias, learned by the topic_head method."""

from __future__ import annotations

from typing import Any

from architectures.kind import ArchitectureKind, Shapes
from architectures.topic_model.spec import memory_terms


def shapes(spec: Any, n_features: int, n_classes: int) -> Shapes:
    return {"B": [n_features, n_classes], "bias": [n_classes]}


KIND = ArchitectureKind(
    name="topic_head",
    parameter_shapes=shapes,
    network=False,
    memory_terms=memory_terms,
    dataset_kind="text",
)
