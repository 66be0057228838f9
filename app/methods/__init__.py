"""The method registry: every method's torch-free spec, registered by importing its module.

To add a method: a spec module here (options, guarantee, plan), a compute module in
workers/methods/ registered under the same name, and a README row (README, "Adding a method").
"""

from app.methods import (
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
from app.methods.spec import (
    MethodChoice,
    MethodOptions,
    MethodSpec,
    get_method,
    method_names,
    method_of,
)

__all__ = [
    "MethodChoice",
    "MethodOptions",
    "MethodSpec",
    "anchor_topics",
    "convex_head",
    "minnorm",
    "minnorm_og",
    "get_method",
    "method_names",
    "method_of",
    "newton",
    "noisy_finetune",
    "output_perturbation",
    "recollection",
    "retrain",
    "sharded_retrain",
    "topic_head",
]
