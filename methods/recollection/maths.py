"""Training with recollection (seed 003, note 003 §3): SGD with batch-gradient clipping at C and
step decay η_t = η·q^t, computing every training sample's recollection vector a_i online.

Forward recursion, at each step t with batch B_t (HVP first, then the new gradient term: the
exact first-order linearisation of note §3):

    a_i ← a_i − η_t·J_t·(H̄_t + λI)·a_i            for every sample already visited
    a_i ← a_i + (η_t/|B_t|)·J_t·∇ℓ(w_t; z_i)       for i ∈ B_t

where J_t is the Jacobian of the clipping map at the batch gradient (the identity when the
gradient is not clipped), so the recursion linearises exactly the update that training made.

The cost is Σ_t visited_t HVPs. H̄_t is applied to all visited vectors at once, in chunks, by
curvature.py beside this file: for logistic regression with the batch Hessian's closed form
(two thin GEMMs per chunk, fused into an in-place update), for MLPs with the R-operator
written out as batched GEMMs, for anything else with torch.func (vmap over jvp of grad).
The vectors are held in the order samples are first visited, so the visited ones are always
a contiguous prefix updated in place (no gather/scatter); they are put back into training
order once, in place, at the end.

The training trajectory itself (the batch gradient, the clipped step) is computed the same way
with or without recording, so the coupled retrain replays it exactly. The same function with
`exclude` and no recording is the coupled retrain of note §1.1: the same batches with the removed
samples taken out and the denominator |B_t| kept. Every tensor lives on X's device.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from app.core.jsontypes import JsonObject
from app.core.specs import ArchitectureSpec, TrainingConfig, training_of
from maths.linalg import extreme_eigenvalues
from maths.nets import FlatModel
from maths.norms import clip_vector
from maths.training import seeded_net
from methods.recollection.curvature import (
    ClipJacobian,
    Curvature,
    StepCurvature,
    batch_loss_of,
    curvature_for,
)


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


def _spectral_rho(
    hvp: Callable[[torch.Tensor], torch.Tensor],
    d: int,
    eta: float,
    iters: int,
    gen: torch.Generator,
    device: torch.device,
) -> float:
    """ρ_t = max(|1 − η λ_min|, |1 − η λ_max|) of H̄ + λI by power iteration (Lemma 2); the start
    vectors come from the CPU generator `gen`, moved to `device`."""
    lam_max, lam_min = extreme_eigenvalues(hvp, d, iters, gen, device=device)
    return max(abs(1 - eta * lam_min), abs(1 - eta * lam_max))


def _gradient(loss: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """∇loss(w) by reverse mode on a leaf copy of w: the same kernels and bits as
    torch.func.grad (which the trajectory used before), without its per-call overhead."""
    leaf = w.detach().requires_grad_(True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(loss(leaf), leaf)
    return g


def _first_visits(
    batches: list[torch.Tensor], keep: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int], np.ndarray]:
    """Per step: the members (kept samples of the batch), their rows in the visit-ordered
    store, and how many rows were visited before the step; and slot[i], the row of sample i
    (samples never visited get the rows after the visited ones)."""
    n = len(keep)
    keep_np = keep.cpu().numpy()
    slot = np.full(n, -1, dtype=np.int64)
    members, rows, before = [], [], []
    k = 0
    for batch in batches:
        b = batch.numpy()
        m = b[keep_np[b]]
        before.append(k)
        new = m[slot[m] < 0]
        slot[new] = np.arange(k, k + len(new))
        k += len(new)
        members.append(torch.from_numpy(m))
        rows.append(torch.from_numpy(slot[m].copy()))
    unvisited = np.flatnonzero(slot < 0)
    slot[unvisited] = np.arange(k, k + len(unvisited))
    return members, rows, before, slot


def _permute_rows_(A: torch.Tensor, src: np.ndarray) -> None:
    """A[i] ← A[src[i]] for every i at once, in place (src a permutation): one row of scratch
    instead of a second copy of A."""
    done = src == np.arange(len(src))
    tmp = torch.empty_like(A[0])
    for start in np.flatnonzero(~done).tolist():
        if done[start]:
            continue
        tmp.copy_(A[start])
        i = start
        while True:
            done[i] = True
            j = int(src[i])
            if j == start:
                A[i].copy_(tmp)
                break
            A[i].copy_(A[j])
            i = j


def _flat_rows_(A: torch.Tensor, curv: Curvature, chunk: int = 4096) -> None:
    """Rows from the curvature's internal layout back to FlatModel order, in place."""
    if curv.flat_layout:
        return
    for s in range(0, len(A), chunk):
        A[s : s + chunk] = curv.to_flat(A[s : s + chunk])


def _hvp_operator(curv: Curvature, step: StepCurvature) -> Callable[[torch.Tensor], torch.Tensor]:
    """v ↦ (H̄_t + λI)v on flat vectors, for power iteration."""

    def op(v: torch.Tensor) -> torch.Tensor:
        return curv.to_flat(step.hvp(curv.to_internal(v).unsqueeze(0)))[0]

    return op


def train_recollection(
    architecture: ArchitectureSpec | JsonObject,
    config: TrainingConfig | JsonObject,
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
    closed_form: bool = True,
    chunk: int | None = None,
) -> RecollectionRun:
    """Train (seeded init, seeded batch order) and, if `record`, every sample's a_i.

    `closed_form=False` forces the generic torch.func HVPs (the reference the closed forms are
    tested against); `chunk` overrides the number of vectors per HVP call."""
    start = time.perf_counter()
    cfg = training_of(config)
    device = X.device
    y = y.to(device)
    n = len(y)
    n_features = int(np.prod(X.shape[1:]))
    net = seeded_net(architecture, n_features, n_classes, cfg.seed, device)
    model = FlatModel(net)
    w = model.flat()
    d = w.numel()
    lam = cfg.weight_decay
    sched = batch_schedule(n, cfg.epochs, cfg.batch_size, cfg.seed, cfg.learning_rate, q)
    keep = torch.ones(n, dtype=torch.bool) if exclude is None else ~exclude.cpu()
    members_of, rows_of, visited_before, slot = _first_visits(sched.batches, keep)
    curv = curvature_for(architecture, model, X, y, lam, closed_form, chunk)
    A = torch.zeros((n, d), dtype=w.dtype, device=device) if record else None
    check_every = max(1, sched.steps // max(rho_checks, 1))
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    rho_trace: list[tuple[int, float]] = []
    clipped = 0

    for t in range(sched.steps):
        eta_t, size = sched.etas[t], len(sched.batches[t])
        members = members_of[t].to(device)
        batch_loss = batch_loss_of(model, X[members], y[members], size, lam)
        g = _gradient(batch_loss, w)
        clipped += int(float(g.norm()) > C)
        if record or t % check_every == 0:
            step = curv.at(w, members, size)
            if t % check_every == 0:
                op = _hvp_operator(curv, step)
                rho = _spectral_rho(op, d, eta_t, power_iterations, gen, device)
                rho_trace.append((t, rho))
            if A is not None:
                J = ClipJacobian(curv.to_internal(g), C)
                if visited_before[t]:
                    step.descend_(A[: visited_before[t]], eta_t, J)
                rows = rows_of[t].to(device)
                A.index_add_(0, rows, J(step.sample_grads()), alpha=eta_t / size)
        w = w - eta_t * clip_vector(g, C)
        if progress is not None and (t + 1) % sched.batches_per_epoch == 0:
            progress((t + 1) // sched.batches_per_epoch, cfg.epochs, float(batch_loss(w)))
    if A is not None:
        _permute_rows_(A, slot)
        _flat_rows_(A, curv)
    return RecollectionRun(
        state=model.state(w),
        vectors=A,
        schedule=sched,
        rho=max(r for _, r in rho_trace),
        rho_trace=rho_trace,
        clipped_steps=clipped,
        seconds=time.perf_counter() - start,
    )
