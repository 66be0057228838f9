"""The architectures: one package each, `architectures/<name>/spec.py` (torch-free hooks, an
`ArchitectureKind`) beside `architectures/<name>/net.py` (torch: build, and where the generic
way does not fit, score and load). Their typed options are in app/core/specs.py, one class each
in the `ArchitectureSpec` union.

This module is the registry of the torch-free halves. To add an architecture: its options
class in app/core/specs.py, a folder with both halves, one line below (README, "Adding an
architecture")."""

from __future__ import annotations

from typing import Any

from architectures.kind import ArchitectureKind
from architectures.logreg.spec import KIND as logreg
from architectures.mlp.spec import KIND as mlp
from architectures.random_features.spec import KIND as random_features
from architectures.topic_head.spec import KIND as topic_head
from architectures.topic_model.spec import KIND as topic_model

KINDS: dict[str, ArchitectureKind] = {
    k.name: k for k in (logreg, mlp, random_features, topic_model, topic_head)
}


def kind_of(spec: Any) -> ArchitectureKind:
    """The kind of a typed architecture spec (its `type`)."""
    return KINDS[spec.type]


__all__ = ["KINDS", "ArchitectureKind", "kind_of"]
