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

from app.specs import TopicHeadSpec, TopicModelSpec, architecture_of
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


class TopicHead(nn.Module):
    """Logits of a topic head: x̄ᵀB + bias, x̄ a document's word frequencies."""

    def __init__(self, B: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.B: torch.Tensor
        self.bias: torch.Tensor
        self.register_buffer("B", B)
        self.register_buffer("bias", bias)

    def forward(self, counts: torch.Tensor) -> torch.Tensor:
        x = counts.reshape(len(counts), -1).to(self.B.dtype)
        return x / x.sum(1, keepdim=True).clamp(min=1.0) @ self.B + self.bias


class TopicModel(nn.Module):
    """A (vocabulary × topics) and R; `forward` maps word counts to the topic mass x̄ᵀA."""

    def __init__(self, A: torch.Tensor, R: torch.Tensor) -> None:
        super().__init__()
        self.A: torch.Tensor
        self.R: torch.Tensor
        self.register_buffer("A", A)
        self.register_buffer("R", R)

    def forward(self, counts: torch.Tensor) -> torch.Tensor:
        x = counts.reshape(len(counts), -1).to(self.A.dtype)
        return x / x.sum(1, keepdim=True).clamp(min=1.0) @ self.A


def load_model(source: str | Path | bytes) -> LoadedModel:
    """One call: the released file (a path or its bytes) → the torch module it describes."""
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    metadata = read_metadata(data)
    tensors = dict(st_load(data))
    spec: dict[str, Any] = json.loads(metadata["architecture"])
    arch = architecture_of(spec)
    module: nn.Module
    if isinstance(arch, TopicHeadSpec):
        module = TopicHead(tensors["B"], tensors["bias"])
    elif isinstance(arch, TopicModelSpec):
        module = TopicModel(tensors["A"], tensors["R"])
    elif "shards" in metadata:  # a sharded model (SISA): its constituents and their vote
        n_features, n_classes = int(metadata["n_features"]), int(metadata["n_classes"])
        module = ensemble_of(arch, tensors, n_features, n_classes, metadata["aggregation"])
    else:
        module = build_net(arch, int(metadata["n_features"]), int(metadata["n_classes"]))
        module.load_state_dict(parameters_of(module, tensors))
    module.train(False)
    return LoadedModel(module, metadata, tensors)
