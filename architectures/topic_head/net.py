"""`topic_head` in torch: logits x̄ᵀB + bias, x̄ a document's word frequencies."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from app.core.specs import TopicHeadSpec


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


def scorer(
    spec: TopicHeadSpec,
    state: dict[str, torch.Tensor],
    n_features: int,
    n_classes: int,
    device: torch.device,
    aggregation: str,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """In float64, on `device` (the worker's)."""
    B, bias = state["B"].to(device).double(), state["bias"].to(device)

    def topic_head(x: torch.Tensor) -> torch.Tensor:
        counts = x.reshape(len(x), -1).double()
        frequencies = counts / counts.sum(1, keepdim=True).clamp(min=1.0)
        return frequencies @ B + bias

    return topic_head


def load(spec: TopicHeadSpec, tensors: dict[str, torch.Tensor]) -> nn.Module:
    return TopicHead(tensors["B"], tensors["bias"])
