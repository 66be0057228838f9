"""Unlearning methods, one module each behind the interface in `base`."""

from __future__ import annotations

import importlib
import time
from typing import Any

from app.methods import KNOWN_METHODS
from workers.methods.base import ModelSpec, RetainedData, Trained, UnlearningMethod


def method_for(name: str, spec: ModelSpec) -> UnlearningMethod:
    """Instantiate the named method for a model (its module exposes `Method`)."""
    entry: dict[str, Any] = KNOWN_METHODS[name]
    return importlib.import_module(entry["module"]).Method(spec)


def fit(spec: ModelSpec, data: RetainedData, progress: Any = None) -> Trained:
    """Train as the model's method requires: with its own recording (e.g. recollection
    vectors) when the method trains itself, else plain seeded SGD."""
    method = method_for(spec.method["name"], spec)
    if hasattr(method, "train"):
        return method.train(data, progress)
    from workers.training import train

    start = time.perf_counter()
    state = train(spec.architecture, spec.training, data.X, data.y, spec.n_classes, progress)
    return Trained(
        state=state,
        statistics=None,
        record={},
        metrics={"train_seconds": time.perf_counter() - start, "n_train": len(data.y)},
    )
