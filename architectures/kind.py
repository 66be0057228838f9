"""What every architecture declares without torch (the API, the memory estimate and the
weights check read it): its parameter names and shapes, whether it is a classifier, whether
it is a network trained by SGD, and the widths its activations take. The torch half of an
architecture (`architectures/<name>/net.py`: build, score, load) is found by its name
(`architectures.nets.net_of`), as a method's compute half is."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

Shapes = dict[str, list[int]]


def _no_parameters(spec: Any, n_features: int, n_classes: int) -> Shapes:
    return {}


@dataclass(frozen=True)
class ArchitectureKind:
    """One architecture's torch-free hooks. `parameter_shapes` mirrors the names and shapes
    of the module `net.py` builds (tests/integration/test_registry.py pins them together);
    `activation_widths` are the layer widths one batch's activations take; `feature_width`
    the width of the features a method's own statistics see (the bias coordinate included);
    `memory_terms` replaces the network terms of the job's memory estimate for an
    architecture that is not a network (app/core/services/memory.py); `dataset_kind` the one
    kind of dataset it learns from, if it is restricted to one."""

    name: str
    parameter_shapes: Callable[[Any, int, int], Shapes] = _no_parameters
    classifier: bool = True
    network: bool = True
    activation_widths: Callable[[Any, int, int], list[int]] = lambda spec, d, c: [d, c]
    feature_width: Callable[[Any, int], int] = lambda spec, d: d + 1
    memory_terms: Callable[[Any, int], dict[str, int]] | None = None
    dataset_kind: str | None = None  # the only kind of dataset it learns from ("text")

    def parameters(self, spec: Any, n_features: int, n_classes: int) -> int:
        """Trained parameters plus frozen buffers of one network."""
        shapes = self.parameter_shapes(spec, n_features, n_classes)
        return sum(prod(shape) for shape in shapes.values())
