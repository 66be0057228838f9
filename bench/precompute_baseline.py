"""The recollection precompute as it was before issue 13 goal 4 (commit 958a522's
workers/recollection.py, verbatim below the imports): torch.func HVPs (vmap over jvp of grad)
on the visited vectors gathered by index, per-sample gradients by vmap over grad. Kept only so
that bench/precompute.py can measure the old code beside the new under the same conditions."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import grad, jvp, vmap

from app.specs import ArchitectureSpec, TrainingConfig, training_of
from maths.linalg import extreme_eigenvalues
from maths.nets import FlatModel
from maths.norms import clip_vector
from maths.training import seeded_net

CHUNK = 2048  # vectors per vmap call: larger chunks amortise torch.func overhead


@dataclass
class Schedule:
    """The deterministic batch order and step sizes of a training run."""

    batches: list[torch.Tensor]
    etas: list[float]
    batch_size: int
    batches_per_epoch: int

    @property
    def steps(self) -> int:
        return len(self.batches)

    def steps_of(self, positions: list[int]) -> list[list[int]]:
        """For each training-order position, the global steps whose batch contains it."""
        where: dict[int, list[int]] = {p: [] for p in positions}
        for t, batch in enumerate(self.batches):
            for p in batch.tolist():
                if p in where:
                    where[p].append(t)
        return [where[p] for p in positions]


def batch_schedule(
    n: int, epochs: int, batch_size: int, seed: int, eta: float, q: float
) -> Schedule:
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen)
        batches += [order[s : s + batch_size] for s in range(0, n, batch_size)]
    per_epoch = math.ceil(n / batch_size)
    return Schedule(batches, [eta * q**t for t in range(len(batches))], batch_size, per_epoch)


@dataclass
class RecollectionRun:
    state: dict[str, torch.Tensor]
    vectors: torch.Tensor | None  # (n, d) in training order, float32
    schedule: Schedule
    rho: float  # max over checked steps of ‖I − η_t(H̄_t + λI)‖
    rho_trace: list[tuple[int, float]] = field(default_factory=list)
    clipped_steps: int = 0
    seconds: float = 0.0


def _clip_jacobian(g: torch.Tensor, C: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """J of x ↦ x·min(1, C/‖x‖) at g, applied to rows of a matrix."""
    norm = float(g.norm())
    if norm <= C:
        return lambda V: V
    ghat = g / norm

    def apply(V: torch.Tensor) -> torch.Tensor:
        return (C / norm) * (V - (V @ ghat).unsqueeze(-1) * ghat)

    return apply


def _spectral_rho(
    hvp: Callable[[torch.Tensor], torch.Tensor],
    d: int,
    eta: float,
    iters: int,
    gen: torch.Generator,
) -> float:
    """ρ_t = max(|1 − η λ_min|, |1 − η λ_max|) of H̄ + λI by power iteration (Lemma 2)."""
    lam_max, lam_min = extreme_eigenvalues(hvp, d, iters, gen)
    return max(abs(1 - eta * lam_min), abs(1 - eta * lam_max))


def train_recollection(
    architecture: ArchitectureSpec | dict[str, Any],
    config: TrainingConfig | dict[str, Any],
    C: float,
    q: float,
    X: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    record: bool = True,
    exclude: torch.Tensor | None = None,
    rho_checks: int = 10,
    power_iterations: int = 20,
    progress: Callable[[int, int, float], None] | None = None,
) -> RecollectionRun:
    """Train (seeded init, seeded batch order) and, if `record`, every sample's a_i."""
    start = time.perf_counter()
    cfg = training_of(config)
    n = len(y)
    n_features = int(np.prod(X.shape[1:]))
    net = seeded_net(architecture, n_features, n_classes, cfg.seed)
    model = FlatModel(net)
    w = model.flat()
    d = w.numel()
    lam = cfg.weight_decay
    sched = batch_schedule(n, cfg.epochs, cfg.batch_size, cfg.seed, cfg.learning_rate, q)
    keep = torch.ones(n, dtype=torch.bool) if exclude is None else ~exclude
    A = torch.zeros((n, d)) if record else None
    visited = torch.zeros(n, dtype=torch.bool)
    check_every = max(1, sched.steps // max(rho_checks, 1))
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    rho_trace: list[tuple[int, float]] = []
    clipped = 0

    def ce_single(wv: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(model.logits(wv, x.unsqueeze(0)), t.unsqueeze(0))

    per_sample_grad = vmap(grad(ce_single), in_dims=(None, 0, 0))

    for t, batch in enumerate(sched.batches):
        eta_t, size = sched.etas[t], len(batch)
        members = batch[keep[batch]]
        Xb, yb = X[members], y[members]

        def batch_loss(
            wv: torch.Tensor, Xb: torch.Tensor = Xb, yb: torch.Tensor = yb, size: int = size
        ) -> torch.Tensor:
            ce = (
                nn.functional.cross_entropy(model.logits(wv, Xb), yb, reduction="sum")
                if len(yb)
                else wv.sum() * 0.0
            )
            return ce / size + 0.5 * lam * (wv @ wv)

        grad_fn = grad(batch_loss)
        g = grad_fn(w)
        J = _clip_jacobian(g, C)
        clipped += int(float(g.norm()) > C)
        if record or t % check_every == 0:

            def hvp(v: torch.Tensor, grad_fn=grad_fn, w: torch.Tensor = w) -> torch.Tensor:
                return jvp(grad_fn, (w,), (v,))[1]

            if t % check_every == 0:
                rho_trace.append((t, _spectral_rho(hvp, d, eta_t, power_iterations, gen)))
            if A is not None:
                rows = torch.nonzero(visited).flatten()
                for s in range(0, len(rows), CHUNK):
                    idx = rows[s : s + CHUNK]
                    A[idx] -= eta_t * J(vmap(hvp)(A[idx]))
                A[members] += (eta_t / size) * J(per_sample_grad(w, Xb, yb))
                visited[members] = True
        w = w - eta_t * clip_vector(g, C)
        if progress is not None and (t + 1) % sched.batches_per_epoch == 0:
            progress((t + 1) // sched.batches_per_epoch, cfg.epochs, float(batch_loss(w)))
    return RecollectionRun(
        state=model.state(w),
        vectors=A,
        schedule=sched,
        rho=max(r for _, r in rho_trace),
        rho_trace=rho_trace,
        clipped_steps=clipped,
        seconds=time.perf_counter() - start,
    )
