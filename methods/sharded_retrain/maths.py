"""Sharded, sliced training (SISA: Bourtoule et al., "Machine Unlearning", IEEE S&P 2021, §IV).

The training set is split into S disjoint shards; each shard trains its own constituent model,
in R stages: stage j trains on the shard's slices 1..j (cumulative), starting from the
checkpoint of stage j − 1, for e_j = max(1, round(2E/(R + 1))) epochs (§IV-B: the same total
work as E epochs on the whole shard). Every stage starts a fresh optimizer from the previous
checkpoint with its own seed, so a stage's output is a function of (its checkpoint, its data,
its seed) alone: retraining a shard from the checkpoint before the earliest slice that held a
removed sample yields, bit for bit on one machine, the model that training from scratch on the
retained data (same seeds, same assignment) yields. Nothing here touches the database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch

from app.core import shutdown
from app.core.specs import ArchitectureSpec, TrainingConfig
from maths.training import train
from methods.shards import ShardTask, TakeFn

ModelState = dict[str, torch.Tensor]
CPU = torch.device("cpu")  # the assignment is host bookkeeping, whatever the worker's device
StageFn = Callable[[int, int, float], None]  # (shard, stage, its last epoch's mean loss)


def _unit_hash(seed: int, salt: str, key: str) -> int:
    """A stable 64-bit hash of (seed, salt, key), the same on every machine and run."""
    digest = hashlib.blake2b(f"{seed}\x1f{salt}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def assignment_keys(
    X: torch.Tensor,
    y: torch.Tensor,
    subjects: Sequence[str | None],
    external_ids: Sequence[str],
) -> list[str]:
    """What the data says of each sample, never a database id, so that anyone
    holding the data can redraw the assignment: its subject (a subject's samples share one
    shard and one slice), else its external id (the upload's `ids`, or its row number in the
    file), else a hash of its features and label."""
    keys: list[str] = []
    for i in range(len(y)):
        subject = subjects[i] if i < len(subjects) else None
        if subject is not None:
            keys.append(f"subject:{subject}")
        elif i < len(external_ids):
            keys.append(f"id:{external_ids[i]}")
        else:
            keys.append(f"content:{content_hash(X[i], int(y[i]))}")
    return keys


def content_hash(x: torch.Tensor, label: int) -> str:
    """blake2b of a sample's float32 features and its label."""
    raw = x.detach().to(CPU, torch.float32).contiguous().numpy().tobytes()
    return hashlib.blake2b(raw + label.to_bytes(8, "big", signed=True), digest_size=16).hexdigest()


@dataclass(frozen=True, eq=False)
class Assignment:
    """Which shard and slice (both 0-based) each sample belongs to, in `sample_ids` order, as
    int64 CPU tensors: an update looks samples up and restricts the assignment with index
    arrays, never a Python loop over the n samples."""

    sample_ids: torch.Tensor
    shard: torch.Tensor
    slice: torch.Tensor

    @staticmethod
    def draw(
        sample_ids: Sequence[int], keys: Sequence[str], shards: int, slices: int, seed: int
    ) -> Assignment:
        """Seeded and stable: a sample's place depends on its key (`assignment_keys`) and the
        seed only (never on the other samples), so removing samples moves nobody."""
        return Assignment(
            ids_tensor(sample_ids),
            ids_tensor([_unit_hash(seed, "shard", k) % shards for k in keys]),
            ids_tensor([_unit_hash(seed, "slice", k) % slices for k in keys]),
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Assignment) and all(
            torch.equal(a, b)
            for a, b in zip(
                (self.sample_ids, self.shard, self.slice),
                (other.sample_ids, other.shard, other.slice),
                strict=True,
            )
        )

    def __len__(self) -> int:
        return len(self.sample_ids)

    def to_state(self) -> ModelState:
        """Shard and slice as uint8 (S ≤ 64, R ≤ 32): the assignment is most of a sharded
        version's state, sealed and stored with every update (2.4 → 1.0 MB at 100,000)."""
        return {
            ASSIGNMENT_IDS: self.sample_ids,
            ASSIGNMENT_SHARD: self.shard.to(torch.uint8),
            ASSIGNMENT_SLICE: self.slice.to(torch.uint8),
        }

    @staticmethod
    def from_state(state: ModelState) -> Assignment:
        return Assignment(
            ids_tensor(state[ASSIGNMENT_IDS]),
            ids_tensor(state[ASSIGNMENT_SHARD]),
            ids_tensor(state[ASSIGNMENT_SLICE]),
        )

    def positions(self, ids: torch.Tensor) -> torch.Tensor:
        """Where each of `ids` sits in this assignment; LookupError if one is not in it."""
        order = self._order
        ranked = self.sample_ids if order is None else self.sample_ids[order]
        at = torch.searchsorted(ranked, ids).clamp_max(max(len(ranked) - 1, 0))
        if len(ids) and (not len(ranked) or not torch.equal(ranked[at], ids)):
            missing = ids[ranked[at] != ids] if len(ranked) else ids
            raise LookupError(f"sample {int(missing[0])} is not in the recorded shard assignment")
        return at if order is None else order[at]

    @cached_property
    def _order(self) -> torch.Tensor | None:
        """None when the ids ascend (as training's rows do), else the order that sorts them."""
        ids = self.sample_ids
        if bool((ids[1:] > ids[:-1]).all()):
            return None
        return torch.argsort(ids, stable=True)

    def restricted(self, keep: torch.Tensor) -> Assignment:
        """The assignment of the samples in `keep` (in that order)."""
        at = self.positions(keep)
        return Assignment(keep, self.shard[at], self.slice[at])

    def place(self) -> dict[int, tuple[int, int]]:
        """sample id → (shard, slice) as a dict: for reading and tests, not the update path."""
        return dict(
            zip(
                self.sample_ids.tolist(),
                zip(self.shard.tolist(), self.slice.tolist(), strict=True),
                strict=True,
            )
        )


def ids_tensor(values: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """int64 on the CPU, whatever torch's default device (no copy when it already is)."""
    return torch.as_tensor(values, dtype=torch.int64, device=CPU)


ASSIGNMENT_IDS = "sisa.assignment.sample_ids"
ASSIGNMENT_SHARD = "sisa.assignment.shard"
ASSIGNMENT_SLICE = "sisa.assignment.slice"


CHECKPOINTS = "sisa.checkpoint."  # every checkpoint's key prefix starts so


def checkpoint_prefix(shard: int, stage: int) -> str:
    """Noise-free-state key prefix of shard k's checkpoint after stage j (1-based, j < R)."""
    return f"{CHECKPOINTS}s{shard}.r{stage}."


def stage_epochs(epochs: int, slices: int) -> int:
    """e_j = 2E/(R + 1), at least 1 (SISA §IV-B): Σ_j e_j·(j/R)·n = E·n."""
    return max(1, round(2 * epochs / (slices + 1)))


def stage_seed(seed: int, shard: int, stage: int) -> int:
    """The seed of shard k's stage j: initialisation (stage 1) and batch order."""
    return _unit_hash(seed, "stage", f"{shard}:{stage}") % (2**31 - 1)


@dataclass(frozen=True)
class ShardedSetup:
    architecture: ArchitectureSpec
    training: TrainingConfig
    n_features: int
    n_classes: int
    shards: int
    slices: int

    def stage_config(self, shard: int, stage: int) -> TrainingConfig:
        epochs = stage_epochs(self.training.epochs, self.slices)
        seed = stage_seed(self.training.seed, shard, stage)
        return self.training.model_copy(update={"epochs": epochs, "seed": seed})


def stage_rows(
    assignment: Assignment, shard: int, stage: int, rank: torch.Tensor | None = None
) -> torch.Tensor:
    """Row indices (into the assignment's order) of shard k's slices 1..j, in canonical order
    (`rank`, each row's place among the rows sorted by external id: the same rows in the same
    order however they arrived), else by sample id."""
    ids, shards, slices = assignment.sample_ids, assignment.shard, assignment.slice
    rows = ((shards == shard) & (slices < stage)).nonzero().flatten()
    key = ids[rows] if rank is None else rank.to(CPU)[rows]
    return rows[torch.argsort(key, stable=True)]


def slice_counts(assignment: Assignment, shards: int, slices: int) -> torch.Tensor:
    """counts[k, j]: samples in shard k's slice j (0-based)."""
    shard, slice_ = assignment.shard, assignment.slice
    cells = torch.bincount(shard * slices + slice_, minlength=shards * slices)
    return cells.reshape(shards, slices)


def stage_sizes(assignment: Assignment, shards: int, slices: int) -> list[list[int]]:
    """sizes[k][j-1]: samples in shard k's slices 1..j (the data stage j trains on)."""
    sizes: list[list[int]] = slice_counts(assignment, shards, slices).cumsum(1).tolist()
    return sizes


def work(sizes: list[list[int]], epochs_per_stage: int, shard: int, from_stage: int) -> int:
    """Sample-gradient passes to train shard k's stages from_stage..R."""
    return epochs_per_stage * sum(sizes[shard][from_stage - 1 :])


def shard_task(
    setup: ShardedSetup,
    assignment: Assignment,
    shard: int,
    from_stage: int,
    start: ModelState | None,
    rank: torch.Tensor | None = None,
) -> ShardTask:
    """Stages from_stage..R of one shard from `start` (the checkpoint after stage
    from_stage − 1; None: the seeded initialisation of stage 1), with the shard's rows in
    training order (`stage_rows` of its last stage: a stage trains on those of them with a
    lower slice, in the same order)."""
    rows = stage_rows(assignment, shard, setup.slices, rank)
    return ShardTask(
        shard, from_stage, start, assignment.sample_ids[rows], assignment.slice[rows], rows
    )


def run_task(
    setup: ShardedSetup, task: ShardTask, take: TakeFn, on_stage: StageFn | None = None
) -> list[ModelState]:
    """A task's stages, one after the other: their states, the last being the constituent.
    `take` draws a stage's rows (only the shard's are copied)."""
    states: list[ModelState] = []
    state = task.start
    for stage in range(task.from_stage, setup.slices + 1):
        X, y = take(task.rows[task.slices < stage])
        losses: list[float] = []  # the stage's per-epoch mean losses

        def record(_epoch: int, _epochs: int, loss: float, into: list[float] = losses) -> None:
            into.append(loss)

        state = train(
            setup.architecture,
            setup.stage_config(task.shard, stage),
            X,
            y,
            setup.n_classes,
            progress=record if on_stage else None,
            init_state=state,
            interrupt=shutdown.check,
        )
        states.append(state)
        if on_stage is not None:
            on_stage(task.shard, stage, losses[-1] if losses else 0.0)
    return states
