"""What recollection keeps resident between updates: its training
record validated once, and for every training sample the steps at which it was in a batch.

Theorem 2's bound (seed 003, unfolded sum, note 003 §5.2) needs the steps of each removed
sample. Replaying the batch schedule for them walked all n samples of every epoch in Python on
every update; with the table made once, an update reads its k
samples' rows: O(k · epochs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from app.core.jsontypes import JsonMap
from methods.recollection.maths import batch_schedule
from methods.recollection.sensitivity import (
    recollection_sensitivity_schedule,
    recollection_worst_cases,
)
from methods.recollection.spec import RecollectionRecord


@dataclass(frozen=True)
class Replay:
    """The record's batch schedule as arrays: `steps[e, p]` is the global step of epoch e
    whose batch held training position p."""

    source: JsonMap  # the record as the update was given it (the worker keeps one object)
    record: RecollectionRecord
    ids: np.ndarray  # the training samples' ids, ascending (int64)
    positions: np.ndarray  # positions[i]: the training-order position of ids[i]
    steps: np.ndarray  # (epochs, n) int32
    etas: np.ndarray  # η_t per step
    sizes: np.ndarray  # |B_t| per step
    _worst: list[np.ndarray] = field(default_factory=list, repr=False)  # made on first use

    @classmethod
    def of(cls, source: JsonMap) -> Replay:
        """Validate the record and replay its schedule once: O(n · epochs), vectorised."""
        record = RecollectionRecord.model_validate(source)
        order = np.asarray(record.train_sample_ids, dtype=np.int64)
        n = len(order)
        schedule = batch_schedule(
            n, record.epochs, record.batch_size, record.seed, record.eta, record.q
        )
        steps = np.full((record.epochs, n), -1, dtype=np.int32)
        for t, batch in enumerate(schedule.batches):
            steps[t // schedule.batches_per_epoch, batch.numpy()] = t
        assert (steps >= 0).all(), "every epoch's batches cover every position once"
        ascending = np.argsort(order, kind="stable").astype(np.int32)
        return cls(
            source=source,
            record=record,
            ids=order[ascending],
            positions=ascending,
            steps=steps,
            etas=np.asarray(schedule.etas, dtype=float),
            sizes=np.asarray([len(b) for b in schedule.batches], dtype=float),
        )

    def made_from(self, source: JsonMap | None) -> bool:
        """Whether this replays `source` (a record recorded anew is another object)."""
        return source is self.source

    def steps_of(self, sample_ids: list[int]) -> np.ndarray:
        """(k, epochs): the steps at which each sample was in a batch, ascending per row."""
        wanted = np.asarray(sample_ids, dtype=np.int64)
        at = np.searchsorted(self.ids, wanted)
        known = at < len(self.ids)
        known[known] = self.ids[at[known]] == wanted[known]
        if not known.all():
            raise KeyError(f"samples {wanted[~known][:5].tolist()} were not trained on")
        return self.steps[:, self.positions[at]].T

    def sensitivity(self, removed_total: list[int]) -> float:
        """Theorem 2 (unfolded) for every sample removed since the vectors were recorded."""
        r = self.record
        return recollection_sensitivity_schedule(
            self.etas, r.C, r.rho, self.steps_of(removed_total), self.sizes
        )

    def worst_case(self, m: int) -> float:
        """Theorem 2 for the worst m training samples: what σ is calibrated on, a
        function of the record and the count alone. The table is made once: O(n · epochs)."""
        if not self._worst:
            r = self.record
            self._worst.append(
                recollection_worst_cases(self.etas, r.C, r.rho, self.steps, self.sizes)
            )
        table = self._worst[0]
        if not 0 <= m < len(table):
            raise KeyError(f"{m} samples removed of {len(table) - 1} trained on")
        return float(table[m])
