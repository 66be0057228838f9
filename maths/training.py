"""Deterministic minibatch training (seeded init and batch order) with progress callbacks."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
from lethe_client.jsontypes import JsonObject
from lethe_client.specs import ArchitectureSpec, TrainingConfig, architecture_of, training_of
from torch import nn

from architectures import kind_of
from architectures.nets import net_of
from maths.ensemble import count_shards, ensemble_of
from maths.nets import build_net, parameters_of, state_of
from maths.norms import project_parameters_

ProgressFn = Callable[[int, int, float], None]


class Diverged(ValueError):
    """Training (or a retrain) ended with non-finite weights or a non-finite loss: nothing
    from it may be released."""


def check_finite(state: dict[str, torch.Tensor]) -> None:
    """Raise Diverged when a floating-point tensor of `state` holds NaN or ±inf."""
    bad = [k for k, v in state.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if bad:
        names = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise Diverged(f"non-finite weights ({names})")


def check_converged(
    architecture: ArchitectureSpec | JsonObject,
    state: dict[str, torch.Tensor],
    X: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    aggregation: str = "probabilities",
) -> None:
    """Raise Diverged when `check_finite` does, or, for a classifier, when its mean
    cross-entropy on (X, y) is not finite."""
    check_converged_on(architecture, state, [(X, y)], n_classes, aggregation)


def check_converged_on(
    architecture: ArchitectureSpec | JsonObject,
    state: dict[str, torch.Tensor],
    blocks: Iterable[tuple[torch.Tensor, torch.Tensor]],
    n_classes: int,
    aggregation: str = "probabilities",
) -> None:
    """`check_converged` over rows given in blocks: the loss summed a block at a time, so
    rows held by a resident session are not copied whole."""
    check_finite(state)
    if not is_classifier(architecture):
        return
    total, count = 0.0, 0
    with torch.no_grad():
        for X, y in blocks:
            if not len(y):
                continue
            scores = logits(architecture, state, X, n_classes, aggregation).double()
            target = y.to(scores.device)
            total += float(nn.functional.cross_entropy(scores, target, reduction="sum"))
            count += len(y)
    loss = total / count if count else 0.0
    if not np.isfinite(loss):
        raise Diverged(f"the training loss is {loss}")


def seeded_net(
    architecture: ArchitectureSpec | JsonObject,
    n_features: int,
    n_classes: int,
    seed: int,
    device: torch.device | None = None,
) -> nn.Module:
    """Initialised on CPU from `seed` (the same weights on every device), then moved.

    Seeds the CPU generator itself: `torch.manual_seed` also queues a lazy CUDA seeding that
    records a stack trace on every call, even without a GPU (a sharded update seeds a net per
    stage it retrains). Where CUDA is present it is seeded too, as before."""
    torch.random.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    net = build_net(architecture, n_features, n_classes)
    return net if device is None else net.to(device)


def train(
    architecture: ArchitectureSpec | JsonObject,
    config: TrainingConfig | JsonObject,
    X: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    progress: ProgressFn | None = None,
    init_state: dict[str, torch.Tensor] | None = None,
    project_radius: float | None = None,
    interrupt: Callable[[], None] | None = None,
    row_order: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """SGD with weight decay over seeded shuffles; returns the final parameters.

    From a seeded initialisation, or from `init_state` (fine-tuning with a fresh optimizer);
    with `project_radius`, projected SGD onto the ball ‖w‖ ≤ C after every step. Runs on the
    device of X; the shuffles come from a seeded CPU generator (the same batches everywhere).
    `interrupt` runs before each epoch: a worker's check that raises when it is stopping.
    `row_order`: the rows' canonical order (row k of it is the k-th row the shuffles see), so
    that the same set of rows trains to the same bits in whatever order it is held.
    """
    cfg = training_of(config)
    net = _starting_net(architecture, cfg, X, n_classes, init_state, project_radius)
    opt = torch.optim.SGD(
        net.parameters(), lr=cfg.learning_rate, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    loss_fn = nn.CrossEntropyLoss()
    epochs, batch = cfg.epochs, cfg.batch_size
    net.train()
    for epoch in range(epochs):
        if interrupt is not None:
            interrupt()
        order = torch.randperm(len(y), generator=gen, device=gen.device)
        if row_order is not None:
            order = row_order[order]
        order = order.to(X.device)
        # the epoch's loss, summed on the device in float64 (no host sync per step)
        total = torch.zeros((), dtype=torch.float64, device=X.device)
        for start in range(0, len(y), batch):
            idx = order[start : start + batch]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(X[idx]), y[idx])
            loss.backward()
            opt.step()
            if project_radius is not None:
                project_parameters_(net, project_radius)
            if progress is not None:
                total += loss.detach().double() * len(idx)
        if progress is not None:
            progress(epoch + 1, epochs, float(total) / max(len(y), 1))
    return state_of(net)


def _starting_net(
    architecture: ArchitectureSpec | JsonObject,
    cfg: TrainingConfig,
    X: torch.Tensor,
    n_classes: int,
    init_state: dict[str, torch.Tensor] | None,
    project_radius: float | None,
) -> nn.Module:
    """The net training starts from: seeded, or `init_state`; projected onto the ball."""
    n_features = int(np.prod(X.shape[1:]))
    net = seeded_net(architecture, n_features, n_classes, cfg.seed, X.device)
    if init_state is not None:
        net.load_state_dict(init_state)
    if project_radius is not None:
        project_parameters_(net, project_radius)
    return net


def finetune(
    architecture: ArchitectureSpec,
    config: TrainingConfig,
    n_classes: int,
    state: dict[str, torch.Tensor],
    X: torch.Tensor,
    y: torch.Tensor,
    epochs: int,
    learning_rate: float,
    interrupt: Callable[[], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Noiseless SGD on retained data from `state` with a fresh optimizer (seed 002: post-
    processing of a noisy release, so the certificate still holds)."""
    if not epochs or len(y) == 0:
        return state
    tuned = config.model_copy(
        update={"epochs": epochs, "learning_rate": learning_rate, "momentum": 0.0}
    )
    return train(architecture, tuned, X, y, n_classes, init_state=state, interrupt=interrupt)


def is_classifier(architecture: ArchitectureSpec | JsonObject) -> bool:
    """Whether the architecture maps inputs to class logits (not the topic model)."""
    return kind_of(architecture_of(architecture)).classifier


@torch.no_grad()
def logits(
    architecture: ArchitectureSpec | JsonObject,
    state: dict[str, torch.Tensor],
    X: torch.Tensor,
    n_classes: int,
    aggregation: str = "probabilities",
) -> torch.Tensor:
    """Class logits of a released state: the network built from the spec, a sharded
    ensemble's aggregated log-probabilities (`shard{k}.*` keys; SISA §IV-D), or a topic head's
    x̄ᵀB + bias (x̄ the word frequencies; seed 000 §A.6). Computed a block of rows at a
    time, so a network's activations (a clipped copy of the features, hidden layers) are
    never held for every row at once (1.6 GB at 800,000 × 256)."""
    n_features = int(np.prod(X.shape[1:]))
    return scorer(architecture, state, n_features, n_classes, X.device, aggregation)(X)


def scorer(
    architecture: ArchitectureSpec | JsonObject,
    state: dict[str, torch.Tensor],
    n_features: int,
    n_classes: int,
    device: torch.device,
    aggregation: str = "probabilities",
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`logits` with the module built once, for scoring several sets with one release (a
    sharded ensemble is S networks: building it per set was most of an update's scoring);
    a logistic regression's with its layer's own functional forward (building and loading
    the module was a millisecond of every update's accuracies)."""
    arch = architecture_of(architecture)
    own = getattr(net_of(arch), "scorer", None)  # the architecture's own forward, if any
    if own is not None:
        forward = own(arch, state, n_features, n_classes, device, aggregation)
        return torch.no_grad()(lambda X: _in_blocks(forward, X.to(device)))
    if count_shards(state):
        net: torch.nn.Module = ensemble_of(arch, state, n_features, n_classes, aggregation)
        net = net.to(device)
    else:
        net = build_net(architecture, n_features, n_classes).to(device)
        net.load_state_dict(parameters_of(net, state))  # copies across devices and dtypes
    net.train(False)  # inference mode
    return torch.no_grad()(lambda X: _in_blocks(net, X.to(device)))


SCORE_BLOCK = 65_536  # rows per forward pass when scoring


def _in_blocks(f: Callable[[torch.Tensor], torch.Tensor], X: torch.Tensor) -> torch.Tensor:
    if len(X) <= SCORE_BLOCK:
        return f(X)
    return torch.cat([f(X[s : s + SCORE_BLOCK]) for s in range(0, len(X), SCORE_BLOCK)])


@torch.no_grad()
def accuracy(
    architecture: ArchitectureSpec | JsonObject,
    state: dict[str, torch.Tensor],
    X: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    aggregation: str = "probabilities",
) -> float | None:
    if len(y) == 0 or not is_classifier(architecture):
        return None
    return hits(logits(architecture, state, X, n_classes, aggregation), y)


def hits(scores: torch.Tensor, y: torch.Tensor) -> float | None:
    """The share of rows whose largest logit is their label (None for no rows)."""
    if len(y) == 0:
        return None
    return float((scores.argmax(1) == y).float().mean())
