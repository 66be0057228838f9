"""A sharded method's shard retrains as independent tasks, run here or across the worker pool.

SISA (Bourtoule et al. 2021, §IV) trains each shard's constituent from its own checkpoint, on
its own rows, with its own seeds: the shards of one update do not depend on each other, so
they may run on different workers and come back as the same bits. A task names its rows by
sample id (another worker opens them itself) and by position in the caller's rows (the caller
takes them from memory); `ShardRunner.run` returns each task's stage states, in task order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

ModelState = dict[str, torch.Tensor]
LocalFn = Callable[["ShardTask"], list[ModelState]]
TakeFn = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(X, y) of the rows at these positions."""


@dataclass(frozen=True)
class ShardTask:
    """Stages `from_stage`..R of shard `shard`, from `start` (None: its seeded initialisation).
    `sample_ids`, `slices` and `rows` list the shard's rows of every stage in training order
    (stage j trains on those with slice < j); `rows` are their positions in the caller's data."""

    shard: int
    from_stage: int
    start: ModelState | None
    sample_ids: torch.Tensor
    slices: torch.Tensor
    rows: torch.Tensor

    def encode(self) -> bytes:
        """The task as another worker reads it: ids, slices and the start state (no rows)."""
        tensors = {"ids": self.sample_ids.cpu(), "slices": self.slices.cpu()}
        if self.start is not None:
            tensors |= {f"start.{k}": v.detach().cpu().contiguous() for k, v in self.start.items()}
        tensors["place"] = torch.tensor([self.shard, self.from_stage])
        return save_tensors(tensors)

    @staticmethod
    def decode(data: bytes) -> ShardTask:
        """A task read from another worker: `rows` are the positions in its own ids' order."""
        tensors = load_tensors(data)
        start = {k[len("start.") :]: v for k, v in tensors.items() if k.startswith("start.")}
        ids = tensors["ids"]
        shard, from_stage = tensors["place"].tolist()
        return ShardTask(
            shard=shard,
            from_stage=from_stage,
            start=start or None,
            sample_ids=ids,
            slices=tensors["slices"],
            rows=torch.arange(len(ids)),
        )


def encode_states(states: list[ModelState]) -> bytes:
    """A task's stage states, in order, as one safetensors file."""
    tensors = {
        f"{i}.{k}": v.detach().cpu().contiguous()
        for i, state in enumerate(states)
        for k, v in state.items()
    }
    return save_tensors(tensors)


def decode_states(data: bytes) -> list[ModelState]:
    """`encode_states`' states, in order."""
    states: dict[int, ModelState] = {}
    for name, value in load_tensors(data).items():
        stage, key = name.split(".", 1)
        states.setdefault(int(stage), {})[key] = value
    return [states[i] for i in sorted(states)]


class ShardRunner(Protocol):
    """Runs shard tasks; `local(task)` computes one in this process."""

    def run(self, tasks: Sequence[ShardTask], local: LocalFn) -> list[list[ModelState]]: ...


class InProcess:
    """Every task here, one after the other (embedded mode, and a single task)."""

    def run(self, tasks: Sequence[ShardTask], local: LocalFn) -> list[list[ModelState]]:
        return [local(task) for task in tasks]


IN_PROCESS = InProcess()
