"""sharded_retrain: SISA (Bourtoule et al., "Machine Unlearning", IEEE S&P 2021, §IV).

Training draws a seeded assignment of samples (a subject's together) to S shards × R slices
and trains each shard's constituent in R cumulative stages, keeping the checkpoint after each
stage in the version's noise-free state (never downloadable, purged with its version). A
deletion retrains each affected shard from the checkpoint before the earliest slice holding a
removed sample; the other shards, and the earlier checkpoints, are reused bit for bit. The
checkpoints that saw a removed sample live only in the parent's state, which the commit purges.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from app.core.states import Guarantee, VersionKind
from maths.ensemble import shard_prefix
from maths.training import ProgressFn
from methods.compute import (
    CertificateFields,
    Constant,
    ModelState,
    Release,
    RetainedData,
    Trained,
    UnlearningMethod,
    UpdateInputs,
    canonical_rank,
    register,
)
from methods.sharded_retrain import maths as sh
from methods.sharded_retrain.spec import SPEC, ShardedOptions
from methods.shards import ShardTask, TakeFn


@register
class ShardedRetrain(UnlearningMethod):
    spec = SPEC
    learns = True  # appended rows: their shards retrained from the stage they join

    @property
    def options(self) -> ShardedOptions:
        return self.model.method.options

    @property
    def setup(self) -> sh.ShardedSetup:
        m, o = self.model, self.options
        return sh.ShardedSetup(
            m.architecture, m.training, m.n_features, m.n_classes, o.shards, o.slices
        )

    def train(self, data: RetainedData, progress: ProgressFn | None = None) -> Trained:
        """All S shards from their seeded initialisations, on a freshly drawn assignment."""
        o = self.options
        keys = sh.assignment_keys(data.X, data.y, data.subjects, data.external_ids)
        assignment = sh.Assignment.draw(
            data.sample_ids, keys, o.shards, o.slices, self.model.training.seed
        )
        return self._train_all(data, assignment, progress)

    def _assignment(self, inputs: UpdateInputs) -> tuple[sh.Assignment, sh.Assignment | None]:
        """The recorded assignment with the appended rows placed by the same seeded hash of
        their keys as training draws, and the appended rows' own (None: none)."""
        recorded = sh.Assignment.from_state(inputs.state)
        added = inputs.added
        if added is None or not len(added):
            return recorded, None
        keys = sh.assignment_keys(added.X, added.y, added.subjects, added.external_ids)
        o = self.options
        new = sh.Assignment.draw(
            added.sample_ids, keys, o.shards, o.slices, self.model.training.seed
        )
        both = sh.Assignment(
            torch.cat([recorded.sample_ids, new.sample_ids]),
            torch.cat([recorded.shard, new.shard]),
            torch.cat([recorded.slice, new.slice]),
        )
        return both, new

    def retrain(self, inputs: UpdateInputs) -> tuple[Trained, str]:
        """Every shard from scratch, on the recorded assignment of the retained samples."""
        assignment = self._assignment(inputs)[0].restricted(inputs.retained.ids())
        how = f"retrained all {self.options.shards} shards from scratch"
        return self._train_all(inputs.retained, assignment), how

    def _train_all(
        self, data: RetainedData, assignment: sh.Assignment, progress: ProgressFn | None = None
    ) -> Trained:
        start = time.perf_counter()
        setup = self.setup
        sizes = sh.stage_sizes(assignment, setup.shards, setup.slices)
        epochs = self.model.training.epochs
        total = sum(sh.work(sizes, 1, k, 1) for k in range(setup.shards))
        done = [0]

        def on_stage(shard: int, stage: int, loss: float) -> None:
            """Progress in epochs' worth of work (all stages together do E epochs' worth),
            so "epoch k of E" reads as it does for a single model."""
            done[0] += sizes[shard][stage - 1]
            if progress is not None:
                progress(epochs * done[0] // total if total else epochs, epochs, loss)

        weights: ModelState = {}
        checkpoints: ModelState = {}
        rank = canonical_rank(data)
        tasks = [sh.shard_task(setup, assignment, k, 1, None, rank) for k in range(setup.shards)]
        for task, states in self._run(tasks, data, on_stage):
            _store(weights, checkpoints, task.shard, 1, states)
        metrics: dict[str, Any] = {
            "train_seconds": time.perf_counter() - start,
            "n_train": len(data.y),
            "sisa": {
                **_summary(setup, assignment, sizes),
                "aggregation": self.options.aggregation,
            },
        }
        return Trained(
            state=weights,
            statistics=None,
            record={},
            metrics=metrics,
            extra_state={**checkpoints, **assignment.to_state()},
        )

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        setup = self.setup
        recorded, added = self._assignment(inputs)
        removed = recorded.restricted(sh.ids_tensor(inputs.removed.sample_ids))
        first = _earliest_stages(removed)
        if added is not None:  # an appended row's stage is retrained as a removed one's
            for k, r in _earliest_stages(added).items():
                first[k] = min(first.get(k, r), r)
        retained = recorded.restricted(inputs.retained.ids())
        parts = _parts(inputs.state)
        weights: ModelState = {}
        checkpoints: ModelState = {}
        rank = canonical_rank(inputs.retained)
        tasks = []
        for k in range(setup.shards):
            if k not in first:  # untouched: the same tensors, bit for bit
                weights.update(parts.get(shard_prefix(k), {}))
                _copy_checkpoints(parts, checkpoints, k, range(1, setup.slices))
                continue
            r = first[k]
            _copy_checkpoints(parts, checkpoints, k, range(1, r))
            start_state = _checkpoint(parts, k, r - 1) if r > 1 else None
            tasks.append(sh.shard_task(setup, retained, k, r, start_state, rank))
        for task, states in self._run(tasks, inputs.retained):
            _store(weights, checkpoints, task.shard, task.from_stage, states)
        sizes = sh.stage_sizes(retained, setup.shards, setup.slices)
        details = _work_done(setup, sizes, first, removed, added)
        return Release(
            next_state={**weights, **checkpoints, **retained.to_state()},
            weights=weights,
            certificate=self._certificate(inputs, details),
            event=None,
            statistics_to_delete=list(inputs.removed.sample_ids),
            version_kind=VersionKind.unlearned,
            metrics={
                "unlearn_seconds": time.perf_counter() - start,
                "sisa": {**_summary(setup, retained, sizes), **details},
            },
        )

    def _run(
        self, tasks: list[ShardTask], data: RetainedData, on_stage: sh.StageFn | None = None
    ) -> list[tuple[ShardTask, list[ModelState]]]:
        """The shard tasks through the method's runner (here, or across the worker pool),
        each with its stage states."""
        setup = self.setup

        def local(task: ShardTask) -> list[ModelState]:
            return sh.run_task(setup, task, data.take, on_stage)

        return list(zip(tasks, self.shards.run(tasks, local), strict=True))

    def run_shard_task(self, task: ShardTask, take: TakeFn) -> list[ModelState]:
        return sh.run_task(self.setup, task, take)

    def _certificate(self, inputs: UpdateInputs, details: dict[str, Any]) -> CertificateFields:
        parts = ", ".join(
            f"shard {r['shard']} from slice {r['from_slice']}" for r in details["retrained"]
        )
        n, added = len(inputs.removed.sample_ids), inputs.n_added
        S = details["shards"]
        change = f"without the {n} removed samples"
        if added:
            change = f"with the {added} appended samples placed by the same seeded hash" + (
                f" and {change}" if n else ""
            )
        sentence = (
            f"Exact (SISA, Bourtoule et al. 2021): retrained {parts} {change}, each from the "
            f"checkpoint taken before any of them was seen; the other "
            f"{S - len(details['retrained'])} of {S} shards are unchanged. The ensemble is the "
            f"one training from scratch on the retained data with the same seeds and shard "
            f"assignment gives, so it is (ε=0, δ=0)-indistinguishable from retraining; the "
            f"update did {details['work_fraction']:.1%} of a full retrain's work."
        )
        return CertificateFields(
            guarantee=Guarantee.exact,
            epsilon=0.0,
            delta=0.0,
            sigma=0.0,
            sensitivity=0.0,
            accountant="none (exact retraining of the affected shards)",
            sentence=sentence,
            constants={
                "shards": Constant(float(S), "declared", "S, the number of shards"),
                "slices": Constant(float(details["slices"]), "declared", "R, slices per shard"),
                "work_fraction": Constant(
                    details["work_fraction"],
                    "measured",
                    "sample-gradient passes of this update over those of a full retrain",
                ),
            },
            compares="the released ensemble vs. training it from scratch on the retained data",
            resets_lineage=True,
            details={"sharding": details},
        )

    def reference(self, inputs: UpdateInputs, release: Release) -> ModelState:
        """The release is the exact retrain: its own reference."""
        return release.weights


def _work_done(
    setup: sh.ShardedSetup,
    sizes: list[list[int]],
    first: dict[int, int],
    removed: sh.Assignment,
    added: sh.Assignment | None = None,
) -> dict[str, Any]:
    """Which shards were retrained from which slice, and the share of a full retrain's
    sample-gradient passes that took (for the certificate)."""
    epochs = sh.stage_epochs(setup.training.epochs, setup.slices)
    passes = sum(sh.work(sizes, epochs, k, r) for k, r in first.items())
    full = sum(sh.work(sizes, epochs, k, 1) for k in range(setup.shards))
    per_shard = torch.bincount(removed.shard, minlength=setup.shards).tolist()
    joined = [0] * setup.shards
    if added is not None:
        joined = torch.bincount(added.shard, minlength=setup.shards).tolist()
    return {
        "shards": setup.shards,
        "slices": setup.slices,
        "retrained": [
            {"shard": k, "from_slice": r, "removed": per_shard[k]}
            | ({"added": joined[k]} if added is not None else {})
            for k, r in sorted(first.items())
        ],
        "reused_shards": [k for k in range(setup.shards) if k not in first],
        "sample_passes": passes,
        "full_retrain_sample_passes": full,
        "work_fraction": passes / full if full else 0.0,
    }


def _earliest_stages(removed: sh.Assignment) -> dict[int, int]:
    """shard → the first stage (1-based) whose data held a removed sample (O(k) for the k
    removed samples' places)."""
    first: dict[int, int] = {}
    for k, j in zip(removed.shard.tolist(), removed.slice.tolist(), strict=True):
        first[k] = min(first.get(k, j + 1), j + 1)
    return first


def _parts(state: ModelState) -> dict[str, ModelState]:
    """The state's tensors by prefix (a shard's released weights `shard{k}.`, a checkpoint's
    `sisa.checkpoint.s{k}.r{j}.`), in one pass: looking each prefix up across the whole state
    took S·R passes, a share of a warm update."""
    parts: dict[str, ModelState] = {}
    for name, value in state.items():
        if name.startswith(sh.CHECKPOINTS):  # up to the dot after its stage
            prefix = name[: name.index(".", name.index(".", len(sh.CHECKPOINTS)) + 1) + 1]
        elif name.startswith("shard"):
            prefix = name[: name.index(".") + 1]
        else:
            continue  # the assignment
        parts.setdefault(prefix, {})[name] = value
    return parts


def _checkpoint(parts: dict[str, ModelState], shard: int, stage: int) -> ModelState:
    prefix = sh.checkpoint_prefix(shard, stage)
    return {n[len(prefix) :]: v for n, v in parts.get(prefix, {}).items()}


def _copy_checkpoints(
    parts: dict[str, ModelState], into: ModelState, shard: int, stages: range
) -> None:
    for j in stages:
        into.update(parts.get(sh.checkpoint_prefix(shard, j), {}))


def _store(
    weights: ModelState,
    checkpoints: ModelState,
    shard: int,
    from_stage: int,
    states: list[ModelState],
) -> None:
    """Stage states from_stage..R: checkpoints for stages < R, the last one as the weights."""
    *middle, last = states
    for stage, state in enumerate(middle, start=from_stage):
        prefix = sh.checkpoint_prefix(shard, stage)
        checkpoints.update({prefix + n: v for n, v in state.items()})
    weights.update({shard_prefix(shard) + n: v for n, v in last.items()})


def _summary(
    setup: sh.ShardedSetup, assignment: sh.Assignment, sizes: list[list[int]]
) -> dict[str, Any]:
    """Shard sizes, checkpoints kept, and the expected work of a single-sample deletion."""
    epochs = sh.stage_epochs(setup.training.epochs, setup.slices)
    full = sum(sh.work(sizes, epochs, k, 1) for k in range(setup.shards))
    counts = sh.slice_counts(assignment, setup.shards, setup.slices).tolist()
    n = len(assignment.sample_ids)
    expected = 0.0  # E over a uniformly drawn sample of its deletion's work, over the full
    if full and n:
        for k, row in enumerate(counts):
            for j, count in enumerate(row):
                expected += count * sh.work(sizes, epochs, k, j + 1) / full / n
    return {
        "shard_sizes": [row[-1] for row in sizes],
        "epochs_per_stage": epochs,
        "checkpoints": setup.shards * (setup.slices - 1),
        "expected_work_fraction": expected,
    }
