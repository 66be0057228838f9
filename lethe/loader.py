"""Rebuild a released model from its safetensors file alone (metadata written by
workers/store.weights_metadata). A sharded model comes back as an `Ensemble` whose forward
returns the aggregated log-probabilities."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from torch import nn

from app.core.specs import architecture_of
from architectures.nets import net_of
from maths.ensemble import ensemble_of
from maths.nets import build_net, parameters_of


@dataclass(frozen=True)
class LoadedModel:
    """The module (in inference mode), the metadata, and the raw tensors."""

    module: nn.Module
    metadata: dict[str, str]
    tensors: dict[str, torch.Tensor]

    @property
    def version(self) -> int:
        return int(self.metadata["version"])


def read_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` table of a safetensors file's header (nothing else is decoded)."""
    if len(data) < 8:
        raise ValueError("not a safetensors file")
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + size])
    metadata = header.get("__metadata__") or {}
    if metadata.get("format") != "lethe/1":
        raise ValueError("these weights carry no Lethe metadata (format lethe/1)")
    return dict(metadata)


def load_model(source: str | Path | bytes) -> LoadedModel:
    """One call: the released file (a path or its bytes) → the torch module it describes."""
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    metadata = read_metadata(data)
    tensors = dict(st_load(data))
    spec: dict[str, Any] = json.loads(metadata["architecture"])
    arch = architecture_of(spec)
    module: nn.Module
    own = getattr(net_of(arch), "load", None)  # a module that is not the built network
    if own is not None:
        module = own(arch, tensors)
    elif "shards" in metadata:  # a sharded model (SISA): its constituents and their vote
        n_features, n_classes = int(metadata["n_features"]), int(metadata["n_classes"])
        module = ensemble_of(arch, tensors, n_features, n_classes, metadata["aggregation"])
    else:
        module = build_net(arch, int(metadata["n_features"]), int(metadata["n_classes"]))
        module.load_state_dict(parameters_of(module, tensors))
    module.train(False)
    return LoadedModel(module, metadata, tensors)
