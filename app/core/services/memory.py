"""A job's memory, estimated from the model's spec before anything is written (a
500-topic model on a 20,001-word corpus reached 11.4 GB, and a 64-shard MLP of 4 × 4,096
would need about 13 GB, both accepted). The estimate is the sum of the large arrays the job
holds at once, by what the code keeps (each method adds its own through its spec's
`memory_terms`); it is an order of magnitude, not a measurement, and
it errs high. A model whose estimate exceeds `LETHE_MAX_JOB_MEMORY_BYTES` is refused (422).
"""

from __future__ import annotations

import math
from typing import Any

from app.core.errors import unprocessable
from app.core.specs import ArchitectureSpec, TrainingConfig
from architectures import kind_of
from methods.spec import MemoryFacts, MethodChoice

FLOAT32 = 4


def estimate(
    architecture: ArchitectureSpec,
    training: TrainingConfig,
    method: MethodChoice,
    n_train: int,
    n_features: int,
    n_classes: int,
    n_rows: int | None = None,
) -> dict[str, Any]:
    """{"bytes": total, "terms": {what: bytes}} for training (and updating) this model;
    `n_rows`: every row the worker holds (the test split too), n_train where not given."""
    # the rows, held once with room for an eighth more (a session's appends go there)
    held = max(n_rows or 0, n_train)
    terms: dict[str, int] = {"data": held * n_features * FLOAT32 * 9 // 8}
    kind = kind_of(architecture)
    if kind.memory_terms is not None:  # not a network: the architecture's own arrays
        return _total(terms | kind.memory_terms(architecture, n_features))
    p = kind.parameters(architecture, n_features, n_classes)
    # weights, gradients, momentum and a copy for the release
    terms["parameters"] = p * FLOAT32 * 4
    widest = max(kind.activation_widths(architecture, n_features, n_classes))
    width = kind.feature_width(architecture, n_features)
    terms["activations"] = 4 * training.batch_size * widest * FLOAT32 * 3
    if method.spec.memory_terms is not None:  # what the method keeps besides
        facts = MemoryFacts(architecture, n_train, n_features, n_classes, p, width)
        terms |= method.spec.memory_terms(method.options, facts)
    return _total(terms)


def _total(terms: dict[str, int]) -> dict[str, Any]:
    return {"bytes": sum(terms.values()), "terms": terms}


def check(found: dict[str, Any], limit: int) -> None:
    """422 `model_too_large` with the estimate, its terms and the limit."""
    if found["bytes"] <= limit:
        return
    raise unprocessable(
        "model_too_large",
        f"training and updating this model would take about {_gib(found['bytes'])} of memory; "
        f"this service allows {_gib(limit)} per job (LETHE_MAX_JOB_MEMORY_BYTES)",
        {"estimated_bytes": found["bytes"], "limit_bytes": limit, "terms": found["terms"]},
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB" if n >= 2**30 else f"{math.ceil(n / 2**20)} MiB"
