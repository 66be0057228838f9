"""The methods: one package each, `methods/<name>/spec.py` (torch-free) beside
`methods/<name>/compute.py` (torch) and any maths of its own.

This module is the registry of the specs, and imports no torch. To add a method: a new
folder with both halves, one line below, and a README row (README, "Adding a method").
The compute half is found by the folder's name (`methods.compute.method_for`).
"""

from methods.anchor_topics import spec as anchor_topics
from methods.convex_head import spec as convex_head
from methods.minnorm import spec as minnorm
from methods.minnorm_og import spec as minnorm_og
from methods.newton import spec as newton
from methods.noisy_finetune import spec as noisy_finetune
from methods.output_perturbation import spec as output_perturbation
from methods.recollection import spec as recollection
from methods.retrain import spec as retrain
from methods.sharded_retrain import spec as sharded_retrain
from methods.spec import (
    RETRAIN,
    MethodChoice,
    MethodOptions,
    MethodSpec,
    get_method,
    method_names,
    method_of,
)
from methods.topic_head import spec as topic_head

__all__ = [
    "RETRAIN",
    "MethodChoice",
    "MethodOptions",
    "MethodSpec",
    "anchor_topics",
    "convex_head",
    "get_method",
    "method_names",
    "method_of",
    "minnorm",
    "minnorm_og",
    "newton",
    "noisy_finetune",
    "output_perturbation",
    "recollection",
    "retrain",
    "sharded_retrain",
    "topic_head",
]
