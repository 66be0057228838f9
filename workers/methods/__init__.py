"""Unlearning methods, one module each behind the interface in `base`."""

from __future__ import annotations

import importlib
from typing import Any

from app.methods import KNOWN_METHODS
from workers.methods.base import ModelSpec, UnlearningMethod


def method_for(name: str, spec: ModelSpec) -> UnlearningMethod:
    """Instantiate the named method for a model (its module exposes `Method`)."""
    entry: dict[str, Any] = KNOWN_METHODS[name]
    return importlib.import_module(entry["module"]).Method(spec)
