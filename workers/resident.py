"""Resident model sessions: what a model's updates need, kept in this worker's
memory from one update to the next, so an update reads only what changed.

A session holds the model's retained training rows (ids ascending, opened features and
labels, subjects, external ids), its noise-free state and its test split. It is valid only
while the database's current version is the session's version: `Sessions.take` hands it out
for that version alone and drops it otherwise, so a version another worker committed (or a
failed commit) makes the next update rebuild from the database. Leases stay the truth; a
session is a cache of what the database says at one version, never a source of it.

After an update commits, `advance` overwrites the removed rows in the session's arrays (their
plaintext leaves with the commit; the opened-samples cache of workers/data.py drops them at
the next load of their dataset), marks them dead and moves it to the new version; the arrays
are rebuilt without dead rows once a quarter of them are. The method keeps its own state
beside the rows (`method_state`: convex_head's anchored Hessian), and the session
keeps the model's lineage (its noisy releases since the last exact retrain), extended by each
commit: read from the log, it is one certificate per version to decode, a cost that grew with
every release. For the same reason it keeps the training record of a method that records
training, with the samples removed since (`TrainingRecord`). A session is
forgotten when its model's lease is lost, when an update fails, or when more than `capacity`
models were used since (least recently used first).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import torch

from app.core.jsontypes import JsonMap
from app.privacy.lineage import LineageEvent
from methods.compute import ModelState, RemovedSamples, RetainedData, Rows
from workers.data import SPARE_SHARE, Arrays, object_array

COMPACT_FRACTION = 0.25  # rebuild the arrays once a quarter of their rows have left


@dataclass(frozen=True)
class TrainingRecord:
    """What training recorded for a method's statistics (the newest version's `record`
    metric; None when no version has one) and the samples removed since, ascending. Read
    from the database once per session (`load.training_record`: every version's metrics,
    a cost that grew with every release), then kept by each commit (`after`)."""

    record: JsonMap | None
    removed_since: np.ndarray  # int64, ascending

    def after(self, removed_ids: list[int], new_record: JsonMap | None) -> TrainingRecord:
        """The record once an update removed `removed_ids`: a release that recorded training
        anew starts over (what the database then says: its version is the newest with a
        record, and nothing was removed after it)."""
        if new_record:
            return TrainingRecord(new_record, np.empty(0, dtype=np.int64))
        removed = np.asarray(removed_ids, dtype=np.int64)
        return TrainingRecord(self.record, np.union1d(self.removed_since, removed))


def extended(rows: torch.Tensor, more: torch.Tensor, owned: bool = True) -> torch.Tensor:
    """`rows` then `more`, written into the spare room of `rows`'s storage where it has room
    (rows are a view of the start of a larger buffer); else into a new buffer with room for
    1/SPARE_SHARE more. An append to a million-row session copied all its rows (a second
    gigabyte at its peak); now one in every ~SPARE_SHARE appends does. `rows` must not be
    used again; `owned=False`: others read its buffer (a shared test split), so the rows
    are copied into a buffer of their own, with room."""
    n, k = len(rows), len(more)
    shape = (n + k, *rows.shape[1:])
    row_bytes = rows[0].numel() * rows.element_size() if n else 0
    storage = rows.untyped_storage()
    if (
        owned
        and n
        and rows.is_contiguous()
        and rows.storage_offset() == 0
        and (storage.nbytes() >= (n + k) * row_bytes)
    ):
        whole = rows.new_empty(0).set_(storage)  # every element of the buffer, flat
        out = whole[: (n + k) * rows[0].numel()].view(shape)
        out[n:] = more
        return out
    buffer = rows.new_empty((n + k + (n + k) // SPARE_SHARE, *rows.shape[1:]))
    buffer[:n], buffer[n : n + k] = rows, more  # the room's pages are mapped once written
    return buffer[: n + k]


def appended(values: np.ndarray, more: np.ndarray) -> np.ndarray:
    """`extended` for a session's numpy arrays (ids, marks, subjects, external ids): into the
    room of the buffer `values` starts, where it has room, else a new buffer with room.
    Concatenating them copied ten million ids and object references at every append."""
    n, k = len(values), len(more)
    base = values.base
    if (
        isinstance(base, np.ndarray)
        and base.ndim == 1
        and base.dtype == values.dtype
        and values.strides == base.strides
        and values.__array_interface__["data"][0] == base.__array_interface__["data"][0]
        and len(base) >= n + k
    ):
        out = base[: n + k]
        out[n:] = more
        return out
    buffer = np.empty(n + k + (n + k) // SPARE_SHARE, dtype=values.dtype)
    buffer[:n], buffer[n : n + k] = values, more
    return buffer[: n + k]


@dataclass(frozen=True)
class ModelSession:
    """One model's retained rows and noise-free state at one version.

    The arrays keep their rows in ascending id order; `alive` marks the retained ones. A
    removed row is marked and its features, label, subject and external id are overwritten
    in place when its update commits (O(k), no copy of the rest); the arrays are rebuilt
    without dead rows once they are a quarter of them."""

    model_id: int
    version_id: int
    sample_ids: np.ndarray  # int64, ascending (dead rows included)
    alive: np.ndarray  # bool, per row
    count: int  # alive rows
    X: torch.Tensor
    y: torch.Tensor
    subjects: np.ndarray  # object: str | None per row
    external_ids: np.ndarray  # object: str per row
    state: ModelState
    test: Arrays  # the test split's active rows when the session was made or refreshed
    method_state: object | None = None  # the method's own (UpdateInputs.resident)
    test_left: int | None = None  # test rows gone (erasing or erased) when `test` was read
    test_owned: bool = False  # `test`'s arrays are this session's own (grown), not the cache's
    history: tuple[LineageEvent, ...] | None = None  # the lineage at `version_id` (None: read it)
    record: TrainingRecord | None = None  # a recording method's (None: read it)

    @classmethod
    def of(
        cls,
        model_id: int,
        version_id: int,
        rows: Arrays,
        state: ModelState,
        test: Arrays,
        device: torch.device = torch.device("cpu"),
    ) -> ModelSession:
        """The session of `rows`, its features and labels (and the test split's) on `device`,
        the worker's: a GPU worker's updates then draw the retained rows where they compute
        instead of moving the whole retained set there on every update."""
        n = len(rows)
        return cls(
            model_id,
            version_id,
            np.asarray(rows.sample_ids, dtype=np.int64),
            np.ones(n, dtype=bool),
            n,
            rows.X.to(device),
            rows.y.to(device),
            object_array(rows.subjects),
            object_array(rows.external_ids),
            state,
            replace(test, X=test.X.to(device), y=test.y.to(device)),
        )

    @property
    def device(self) -> torch.device:
        return self.X.device

    def positions(self, rows: np.ndarray) -> torch.Tensor:
        """Row positions as an index tensor on the session's device."""
        return torch.from_numpy(rows).to(self.X.device)

    def __len__(self) -> int:
        return self.count

    def held_ids(self) -> np.ndarray:
        """The ids of the retained rows, ascending."""
        return self.sample_ids[self.alive]

    def rows_of(self, ids: list[int]) -> np.ndarray:
        """The rows of `ids` (each must be held), as positions into the session's arrays."""
        wanted = np.asarray(sorted(ids), dtype=np.int64)
        at = np.searchsorted(self.sample_ids, wanted)
        if wanted.size and (
            at[-1] >= len(self.sample_ids)
            or not np.array_equal(self.sample_ids[at], wanted)
            or not bool(self.alive[at].all())
        ):
            raise LookupError("the session does not hold every sample asked for")
        return at

    def split(
        self, removed_ids: list[int], statistics: dict[int, torch.Tensor], previously: list[int]
    ) -> tuple[RemovedSamples, RetainedData]:
        """The removal, and what is retained as rows drawn from the session only when a method
        reads them (no per-sample Python over n, no copy of the retained set)."""
        out = self.rows_of(removed_ids)
        keep = self.alive.copy()
        keep[out] = False
        out_t = self.positions(out)
        removed = RemovedSamples(
            self.sample_ids[out].tolist(),
            self.X[out_t],
            self.y[out_t],
            statistics=statistics,
            previously_removed=previously,
        )
        return removed, RetainedData.deferred(self.count - len(out), _Kept(self, keep))

    def external_ids_of(self, ids: list[int]) -> dict[int, str]:
        at = self.rows_of(ids)
        return dict(zip(self.sample_ids[at].tolist(), self.external_ids[at].tolist(), strict=True))

    def advance(
        self,
        version_id: int,
        removed_ids: list[int],
        state: ModelState,
        method_state: object | None = None,
        history: tuple[LineageEvent, ...] | None = None,
        record: TrainingRecord | None = None,
    ) -> ModelSession:
        """The session after a committed update: the removed rows overwritten and marked, the
        new state, lineage and training record. The arrays are shared with this session,
        which must not be used again."""
        alive, count = self.alive, self.count
        if removed_ids:
            out = self.rows_of(removed_ids)
            out_t = self.positions(out)
            self.X[out_t] = 0  # the plaintext leaves the worker's memory with the commit
            self.y[out_t] = 0
            self.subjects[out] = None
            self.external_ids[out] = ""
            alive = alive.copy()
            alive[out] = False
            count -= len(out)
        moved = replace(
            self,
            version_id=version_id,
            alive=alive,
            count=count,
            state=state,
            method_state=method_state,
            history=history,
            record=record,
        )
        return moved._compacted() if count <= (1 - COMPACT_FRACTION) * len(alive) else moved

    def grown(self, rows: Arrays, test: Arrays) -> ModelSession:
        """The session with appended rows (ids above every held one) after its own, and the
        appends' test rows after the split's; this one is not used again. The rows are
        written into the spare room `extended` keeps after them, not copied whole."""
        if not len(rows) and not len(test):
            return self
        device = self.device
        grown = self
        if len(rows):
            n = len(rows)
            grown = replace(
                grown,
                sample_ids=appended(self.sample_ids, np.asarray(rows.sample_ids, dtype=np.int64)),
                alive=appended(self.alive, np.ones(n, dtype=bool)),
                count=self.count + n,
                X=extended(self.X, rows.X.to(device, self.X.dtype)),
                y=extended(self.y, rows.y.to(device, self.y.dtype)),
                subjects=appended(self.subjects, object_array(rows.subjects)),
                external_ids=appended(self.external_ids, object_array(rows.external_ids)),
            )
        if len(test):
            t = self.test
            grown = replace(
                grown,
                test=Arrays(
                    [*t.sample_ids, *test.sample_ids],
                    [*t.external_ids, *test.external_ids],
                    # the split shared with the cache is copied once, with room; then the
                    # appends' test rows go into that room (a copy of the whole split each
                    # time held the worker 0.7 s after each append at ten million rows)
                    extended(t.X, test.X.to(t.X), owned=self.test_owned),
                    extended(t.y, test.y.to(t.y.device, t.y.dtype), owned=self.test_owned),
                    [*t.subjects, *test.subjects],
                ),
                test_owned=True,
            )
        return grown

    def _compacted(self) -> ModelSession:
        kept = np.flatnonzero(self.alive)
        at = self.positions(kept)
        return replace(
            self,
            sample_ids=self.sample_ids[kept],
            alive=np.ones(len(kept), dtype=bool),
            X=self.X[at],
            y=self.y[at],
            subjects=self.subjects[kept],
            external_ids=self.external_ids[kept],
        )


@dataclass(frozen=True)
class _Kept:
    """The retained rows of one update: a session's arrays under a mask (a RowSource)."""

    session: ModelSession
    keep: np.ndarray

    def rows(self) -> Rows:
        kept = self._kept
        s = self.session
        at = s.positions(kept)
        return (
            s.sample_ids[kept].tolist(),
            s.X[at],
            s.y[at],
            s.subjects[kept].tolist(),
            s.external_ids[kept].tolist(),
        )

    def blocks(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The retained rows in blocks of `size` of them, as the retained set's own arrays
        would be cut (so a pass sums in the same order, bit for bit, whichever rows are dead
        around them): a view of the session's arrays where a block's rows are consecutive
        there, else those rows copied."""
        X, y, kept = self.session.X, self.session.y, self._kept
        for start in range(0, len(kept), size):
            at = kept[start : start + size]
            first, last = int(at[0]), int(at[-1])
            if last - first + 1 == len(at):  # no dead row among them
                yield X[first : last + 1], y[first : last + 1]
            else:  # (index_select: a fourth of an indexing's time on a CPU)
                rows = self.session.positions(at)
                yield torch.index_select(X, 0, rows), torch.index_select(y, 0, rows)

    def head(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` retained rows: a view where no dead row is among them (each
        update's accuracies read them; a copy of 20,000 rows was a share of a deletion)."""
        X, y, at = self.session.X, self.session.y, self._kept[:count]
        if not len(at):
            return X[:0], y[:0]
        first, last = int(at[0]), int(at[-1])
        if last - first + 1 == len(at):
            return X[first : last + 1], y[first : last + 1]
        rows = self.session.positions(at)
        return torch.index_select(X, 0, rows), torch.index_select(y, 0, rows)

    def ids(self) -> torch.Tensor:
        return torch.from_numpy(self.session.sample_ids[self._kept])

    def take(self, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.session.positions(self._kept[at.cpu().numpy()])
        return self.session.X[rows], self.session.y[rows]

    @property
    def device(self) -> torch.device:
        return self.session.device

    @cached_property
    def _kept(self) -> np.ndarray:
        """The session's positions of the retained rows, in row order."""
        return np.flatnonzero(self.keep)


@dataclass(frozen=True)
class HandedState:
    """A model's resident method state at one version, as the process this one replaced
    exported it (workers/handover.py)."""

    version_id: int
    tensors: dict[str, torch.Tensor]


class Sessions:
    """The sessions this process keeps, by (database, model), at most `capacity` of them;
    and the method states its predecessor handed over, until a warm-up takes them."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[str, int], ModelSession] = OrderedDict()
        self._handed: dict[tuple[str, int], HandedState] = {}

    def hand_in(self, database: str, states: dict[int, HandedState]) -> None:
        """The method states the process this one replaced held, by model."""
        with self._lock:
            self._handed |= {(database, model): state for model, state in states.items()}

    def handed(self, database: str, model_id: int) -> HandedState | None:
        """The model's handed-over method state, taken (a second warm-up prepares anew)."""
        with self._lock:
            return self._handed.pop((database, model_id), None)

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

    def peek(self, database: str, model_id: int) -> ModelSession | None:
        """The model's session at whatever version, left in place (a hand-over reads it;
        tests too)."""
        with self._lock:
            return self._held.get((database, model_id))

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

    def models(self, database: str) -> list[int]:
        """The models this process holds sessions for in `database`, least recently used
        first: what a successor process warms (workers/recycle.py)."""
        with self._lock:
            return [model for (where, model) in self._held if where == database]

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._handed.clear()

    def __len__(self) -> int:
        return len(self._held)
