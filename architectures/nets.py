"""The torch halves of the architectures, found by name (`architectures/<name>/net.py`).
Each has `build(spec, n_features, n_classes) -> nn.Module` if it is a network, and may have
`scorer(spec, state, n_features, n_classes, device, aggregation)` (a faster or different
forward than the built module's; None where the generic one fits) and
`load(spec, tensors) -> nn.Module` (a released file whose module is not the built
network)."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def net_of(spec: Any) -> ModuleType:
    """The torch half of `spec`'s architecture."""
    return importlib.import_module(f"architectures.{spec.type}.net")
