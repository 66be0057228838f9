"""`topic_model`: the word–topic matrix A and the topic covariance R of a corpus (seed 000),
learned by the anchor_topics method. Not a network and not a classifier."""

from __future__ import annotations

from typing import Any

from architectures.kind import ArchitectureKind, Shapes

FLOAT64 = 8


def shapes(spec: Any, n_features: int, n_classes: int) -> Shapes:
    return {"A": [n_features, spec.topics], "R": [spec.topics, spec.topics]}


def memory_terms(spec: Any, n_features: int) -> dict[str, int]:
    """Σ G_d, its normalised rows and the solve's working copies: vocabulary² float64 each;
    the topics beside them."""
    return {
        "cooccurrence": 4 * n_features * n_features * FLOAT64,
        "topics": 4 * n_features * spec.topics * FLOAT64,
    }


KIND = ArchitectureKind(
    name="topic_model",
    parameter_shapes=shapes,
    classifier=False,
    network=False,
    memory_terms=memory_terms,
    dataset_kind="text",
)
