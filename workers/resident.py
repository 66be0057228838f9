"""Resident model sessions (issue 28): what a model's updates need, kept in this worker's
memory from one update to the next, so an update reads only what changed.

A session holds the model's retained training rows (ids ascending, opened features and
labels, subjects, external ids), its noise-free state and its test split. It is valid only
while the database's current version is the session's version: `Sessions.take` hands it out
for that version alone and drops it otherwise, so a version another worker committed (or a
failed commit) makes the next update rebuild from the database. Leases stay the truth; a
session is a cache of what the database says at one version, never a source of it.

After an update commits, `advance` drops the removed rows from the session (it no longer
references their plaintext; the opened-samples cache of workers/data.py drops them at the
next load of their dataset) and moves it to the new version. A session is
forgotten when its model's lease is lost, when an update fails, or when more than `capacity`
models were used since (least recently used first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np
import torch

from methods.compute import ModelState, RemovedSamples, RetainedData
from workers.data import Arrays


@dataclass(frozen=True)
class ModelSession:
    """One model's retained rows and noise-free state at one version."""

    model_id: int
    version_id: int
    sample_ids: np.ndarray  # int64, ascending
    X: torch.Tensor
    y: torch.Tensor
    subjects: np.ndarray  # object: str | None per row
    external_ids: np.ndarray  # object: str per row
    state: ModelState
    test: Arrays  # the test split's active rows when the session was made or refreshed

    @classmethod
    def of(
        cls, model_id: int, version_id: int, rows: Arrays, state: ModelState, test: Arrays
    ) -> ModelSession:
        return cls(
            model_id,
            version_id,
            np.asarray(rows.sample_ids, dtype=np.int64),
            rows.X,
            rows.y,
            _objects(rows.subjects),
            _objects(rows.external_ids),
            state,
            test,
        )

    def __len__(self) -> int:
        return int(self.sample_ids.shape[0])

    def rows_of(self, ids: list[int]) -> np.ndarray:
        """The rows of `ids` (each must be held), as positions into the session's arrays."""
        wanted = np.asarray(sorted(ids), dtype=np.int64)
        at = np.searchsorted(self.sample_ids, wanted)
        if wanted.size and (at[-1] >= len(self) or not np.array_equal(self.sample_ids[at], wanted)):
            raise LookupError("the session does not hold every sample asked for")
        return at

    def split(
        self, removed_ids: list[int], statistics: dict[int, torch.Tensor], previously: list[int]
    ) -> tuple[RemovedSamples, RetainedData]:
        """The removal and what is retained, with array masks (no per-sample Python over n)."""
        out = self.rows_of(removed_ids)
        keep = np.ones(len(self), dtype=bool)
        keep[out] = False
        out_t = torch.from_numpy(out)
        kept = np.flatnonzero(keep)
        keep_t = torch.from_numpy(kept)
        removed = RemovedSamples(
            self.sample_ids[out].tolist(),
            self.X[out_t],
            self.y[out_t],
            statistics=statistics,
            previously_removed=previously,
        )
        retained = RetainedData(
            self.sample_ids[kept].tolist(),
            self.X[keep_t],
            self.y[keep_t],
            self.subjects[kept].tolist(),
            self.external_ids[kept].tolist(),
        )
        return removed, retained

    def external_ids_of(self, ids: list[int]) -> dict[int, str]:
        at = self.rows_of(ids)
        return dict(zip(self.sample_ids[at].tolist(), self.external_ids[at].tolist(), strict=True))

    def advance(self, version_id: int, removed_ids: list[int], state: ModelState) -> ModelSession:
        """The session after a committed update: the removed rows gone, the new state."""
        keep = np.ones(len(self), dtype=bool)
        if removed_ids:
            keep[self.rows_of(removed_ids)] = False
        kept = np.flatnonzero(keep)
        at = torch.from_numpy(kept)
        return replace(
            self,
            version_id=version_id,
            sample_ids=self.sample_ids[kept],
            X=self.X[at],
            y=self.y[at],
            subjects=self.subjects[kept],
            external_ids=self.external_ids[kept],
            state=state,
        )


class Sessions:
    """The sessions this process keeps, by (database, model), at most `capacity` of them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[str, int], ModelSession] = OrderedDict()

    def take(self, database: str, model_id: int, version_id: int) -> ModelSession | None:
        """The model's session if it is at `version_id` (the database's current version);
        a session at any other version is dropped."""
        with self._lock:
            held = self._held.get((database, model_id))
            if held is None:
                return None
            if held.version_id != version_id:
                del self._held[(database, model_id)]
                return None
            self._held.move_to_end((database, model_id))
            return held

    def put(self, database: str, session: ModelSession) -> None:
        if self.capacity <= 0:
            return
        with self._lock:
            self._held[(database, session.model_id)] = session
            self._held.move_to_end((database, session.model_id))
            while len(self._held) > self.capacity:
                self._held.popitem(last=False)

    def drop(self, database: str, model_id: int) -> None:
        with self._lock:
            self._held.pop((database, model_id), None)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()

    def __len__(self) -> int:
        return len(self._held)


def _objects(values: list[str | None] | list[str]) -> np.ndarray:
    """A list as a numpy object array (rows are taken by index arrays, not Python loops)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out
