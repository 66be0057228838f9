"""Unlearning methods: one compute module each, registered by importing it here."""

from __future__ import annotations

from workers.methods import (
    anchor_topics,
    convex_head,
    minnorm,
    minnorm_og,
    newton,
    noisy_finetune,
    output_perturbation,
    recollection,
    retrain,
    sharded_retrain,
    topic_head,
)
from workers.methods.base import ModelSpec, RetainedData, Trained
from workers.methods.registry import compute_names, method_for
from workers.training import ProgressFn


def fit(model: ModelSpec, data: RetainedData, progress: ProgressFn | None = None) -> Trained:
    """Train as the model's method requires (recording or constraining where it must)."""
    return method_for(model.method.name, model).train(data, progress)


__all__ = [
    "compute_names",
    "anchor_topics",
    "convex_head",
    "minnorm",
    "minnorm_og",
    "fit",
    "method_for",
    "newton",
    "noisy_finetune",
    "output_perturbation",
    "recollection",
    "retrain",
    "sharded_retrain",
    "topic_head",
]
