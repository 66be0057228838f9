"""`topic_model` in torch: a released file's A and R as a module mapping word counts to
topic mass (lethe/loader.py)."""

from __future__ import annotations

import torch
from torch import nn

from app.core.specs import TopicModelSpec


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


def load(spec: TopicModelSpec, tensors: dict[str, torch.Tensor]) -> nn.Module:
    return TopicModel(tensors["A"], tensors["R"])
