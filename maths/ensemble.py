"""A sharded model's constituents and their aggregation (SISA: Bourtoule et al. 2021, §IV-D).

Released ensemble weights hold constituent k's parameters under `shard{k}.<name>`; the
aggregation (averaged probabilities or majority vote) travels in the safetensors metadata.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from lethe_client.specs import ArchitectureSpec, LogRegSpec
from torch import nn

from maths.nets import ClipFeatures, build_net, parameters_of

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
        return aggregate(self._scores(x), self.aggregation)

    def _scores(self, x: torch.Tensor) -> torch.Tensor:
        """Every member's logits, S × classes × n (a logreg ensemble on the update path is
        scored from its weights instead: `linear_scorer`)."""
        return torch.stack([m(x).T for m in self.members])


def aggregate(scores: torch.Tensor, aggregation: str) -> torch.Tensor:
    """Log-probabilities (n × classes, contiguous) from every member's logits, S × classes ×
    n. Everything is reduced with the rows last in memory: along a last (or strided) dimension
    of 2 to 10 classes torch's CPU kernels took an order of magnitude longer."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}")
    probs = scores.softmax(1)  # S × classes × n
    mean = probs.mean(0)  # classes × n
    if aggregation == "probabilities":
        return mean.clamp_min(torch.finfo(mean.dtype).tiny).log().T.contiguous()
    winners = _first_argmax(probs)  # S × n
    votes = torch.stack([(winners == c).sum(0) for c in range(len(mean))]).to(mean.dtype)
    return ((votes + mean) / (len(scores) + 1)).log().T.contiguous()


def _first_argmax(x: torch.Tensor) -> torch.Tensor:
    """argmax over dim 1 of S × classes × n (the first of equal maxima, as torch's), one
    comparison per class."""
    best, at = x[:, 0], torch.zeros_like(x[:, 0], dtype=torch.long)
    for c in range(1, x.shape[1]):
        better = x[:, c] > best
        best = torch.where(better, x[:, c], best)
        at = at.masked_fill(better, c)
    return at


def stacked_scores(z: torch.Tensor, W: torch.Tensor, b: torch.Tensor, S: int) -> torch.Tensor:
    """S linear members' logits on inputs z in one product: W, b stack their weights
    ((S·classes) × d) and biases; S × classes × n, rows last in memory."""
    scores = torch.addmm(b.unsqueeze(1), W, z.T)  # (S·classes) × n, written in that layout
    return scores.reshape(S, -1, len(z))


def linear_scorer(
    architecture: LogRegSpec, weights: ModelState, aggregation: str, device: torch.device
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A logreg ensemble's log-probabilities straight from its released weights, as
    `Ensemble` computes them, without building a module per member (16 initialised and
    then overwritten linear layers were half of a sharded update's scoring)."""
    states = shard_states(weights, count_shards(weights))
    W = torch.cat([s["1.weight"] for s in states]).to(device)
    b = torch.cat([s["1.bias"] for s in states]).to(device)
    R = architecture.feature_norm
    first: nn.Module = nn.Flatten() if R is None else ClipFeatures(R)
    return lambda x: aggregate(stacked_scores(first(x), W, b, len(states)), aggregation)


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
