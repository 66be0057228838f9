"""Where the workers compute (LETHE_DEVICE = auto | cpu | cuda), and moving a job's tensors
there and back.

A job loads on CPU (the database gives bytes), moves its inputs to the device
(`inputs_to`, `training_inputs_to`), computes, brings the states and statistics back to CPU
(`outcome_to_cpu`, `trained_to_cpu`), then serialises (safetensors) and seals them. The maths
creates its tensors on the device of the data it is given.

Random draws made with a generator (seeded batch orders and initialisations, and the secure
generator of an update's noise and LiSSA batches) are sampled on CPU with that generator and
then moved: a seeded run picks the same batches and starts from the same weights on every
device, so results differ across devices only by floating-point rounding.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from app.core.settings import Settings
from methods.compute import (
    ModelState,
    Release,
    RemovedSamples,
    RetainedData,
    StatisticsBlock,
    Trained,
    UpdateInputs,
)

if TYPE_CHECKING:
    from workers.data import Arrays
    from workers.values import Outcome, TrainingInputs

CPU = torch.device("cpu")


class DeviceUnavailable(RuntimeError):
    """LETHE_DEVICE asks for a device this process cannot use."""


def resolve_device(setting: str) -> torch.device:
    """`auto`: the GPU when torch sees one, else the CPU; `cpu`; `cuda`: the GPU, or
    DeviceUnavailable (raised when the worker or job starts, before any work is claimed)."""
    if setting == "cpu":
        return CPU
    if setting == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else CPU
    if setting == "cuda":
        if not torch.cuda.is_available():
            build = torch.version.cuda or "none (a CPU-only build)"
            raise DeviceUnavailable(
                f"LETHE_DEVICE=cuda, but torch {torch.__version__} sees no CUDA device "
                f"(CUDA build: {build}); run this worker where a GPU is visible, or set "
                "LETHE_DEVICE=auto or cpu"
            )
        return torch.device("cuda")
    raise DeviceUnavailable(f"unknown LETHE_DEVICE={setting!r}: use auto, cpu or cuda")


def worker_device(settings: Settings) -> torch.device:
    """The device `settings` name (LETHE_DEVICE)."""
    return resolve_device(settings.device)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (for timings); a no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---- to the device -------------------------------------------------------------------------


def state_to(state: ModelState, device: torch.device) -> ModelState:
    return {k: v.to(device) for k, v in state.items()}


def retained_to(data: RetainedData, device: torch.device) -> RetainedData:
    return data.to(device)


def removed_to(removed: RemovedSamples, device: torch.device) -> RemovedSamples:
    return replace(
        removed,
        X=removed.X.to(device),
        y=removed.y.to(device),
        statistics={s: v.to(device) for s, v in removed.statistics.items()},
    )


def inputs_to(inputs: UpdateInputs, device: torch.device) -> UpdateInputs:
    """An update's state, samples and per-sample statistics on `device` (no copy where they
    are there already)."""
    return replace(
        inputs,
        state=state_to(inputs.state, device),
        removed=removed_to(inputs.removed, device),
        retained=retained_to(inputs.retained, device),
        test=retained_to(inputs.test, device),
    )


def arrays_to(arrays: Arrays, device: torch.device) -> Arrays:
    return replace(arrays, X=arrays.X.to(device), y=arrays.y.to(device))


def training_inputs_to(inputs: TrainingInputs, device: torch.device) -> TrainingInputs:
    """A training job's samples on `device` (imported weights stay bytes until loaded)."""
    return replace(inputs, data=arrays_to(inputs.data, device), test=arrays_to(inputs.test, device))


# ---- back to CPU, before safetensors or sealing --------------------------------------------


def state_to_cpu(state: ModelState) -> ModelState:
    return {k: v.detach().to(CPU).contiguous() for k, v in state.items()}


def block_to_cpu(block: StatisticsBlock | None) -> StatisticsBlock | None:
    return None if block is None else replace(block, vectors=block.vectors.detach().to(CPU))


def trained_to_cpu(trained: Trained) -> Trained:
    return replace(
        trained,
        state=state_to_cpu(trained.state),
        statistics=block_to_cpu(trained.statistics),
        extra_state=state_to_cpu(trained.extra_state),
    )


def release_to_cpu(release: Release) -> Release:
    return replace(
        release,
        next_state=state_to_cpu(release.next_state),
        weights=state_to_cpu(release.weights),
        replace_statistics=block_to_cpu(release.replace_statistics),
    )


def outcome_to_cpu(outcome: Outcome) -> Outcome:
    decision = replace(outcome.decision, release=release_to_cpu(outcome.decision.release))
    return replace(outcome, decision=decision)
