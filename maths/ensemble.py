"""A sharded model's constituents and their aggregation (SISA: Bourtoule et al. 2021, §IV-D).

Released ensemble weights hold constituent k's parameters under `shard{k}.<name>`; the
aggregation (averaged probabilities or majority vote) travels in the safetensors metadata.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from app.specs import ArchitectureSpec
from maths.nets import build_net, parameters_of

ModelState = dict[str, torch.Tensor]
AGGREGATIONS = ("probabilities", "vote")


def shard_prefix(shard: int) -> str:
    """Released-weights key prefix of constituent k (its state after the last stage)."""
    return f"shard{shard}."


def shard_states(weights: ModelState, shards: int) -> list[ModelState]:
    """The S constituents of released ensemble weights, their keys unprefixed."""
    out: list[ModelState] = []
    for k in range(shards):
        prefix = shard_prefix(k)
        out.append({n[len(prefix) :]: v for n, v in weights.items() if n.startswith(prefix)})
    return out


def count_shards(state: ModelState) -> int:
    """S for an ensemble's weights or noise-free state (0: not an ensemble)."""
    k = 0
    while any(n.startswith(shard_prefix(k)) for n in state):
        k += 1
    return k


class Ensemble(nn.Module):
    """S constituents aggregated into log-probabilities (SISA §IV-D). `probabilities`:
    log of the averaged softmax. `vote`: log((votes + averaged probabilities) / (S + 1)),
    a distribution whose argmax is the majority vote, ties broken by averaged probability
    (the probabilities sum to 1 < one vote)."""

    def __init__(self, members: Sequence[nn.Module], aggregation: str) -> None:
        super().__init__()
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}")
        self.members = nn.ModuleList(members)
        self.aggregation = aggregation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.stack([m(x).softmax(-1) for m in self.members])  # S × n × classes
        mean = probs.mean(0)
        if self.aggregation == "probabilities":
            return mean.clamp_min(torch.finfo(mean.dtype).tiny).log()
        votes = nn.functional.one_hot(probs.argmax(-1), mean.shape[-1]).sum(0).to(mean.dtype)
        return ((votes + mean) / (len(self.members) + 1)).log()


def ensemble_of(
    architecture: ArchitectureSpec,
    weights: ModelState,
    n_features: int,
    n_classes: int,
    aggregation: str,
) -> Ensemble:
    """The ensemble module of released weights `shard{k}.<param>` (built on CPU)."""
    members = []
    for own in shard_states(weights, count_shards(weights)):
        net = build_net(architecture, n_features, n_classes)
        net.load_state_dict(parameters_of(net, own))
        members.append(net)
    return Ensemble(members, aggregation)
