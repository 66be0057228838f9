"""Loading a model's training set and a dataset's test split from the database into tensors,
opening each sample's sealed payload with its data key (app/core/storage/crypto.py)."""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sqlalchemy import Engine, Select, String, case, cast, select
from sqlalchemy.orm import Session

from app.core.db.chunks import chunked
from app.core.db.tables import DataKey, Dataset, ModelSample, Sample
from app.core.states import SampleStatus
from app.core.storage.crypto import Keyring, SampleRecord, open_sealed, sample_aad
from app.core.storage.sample_blocks import block_records, columns, open_records, opened_blocks
from workers import collector


@dataclass
class Arrays:
    sample_ids: list[int]
    external_ids: list[str]
    X: torch.Tensor
    y: torch.Tensor
    subjects: list[str | None]

    def __len__(self) -> int:
        return len(self.sample_ids)


def _open_rows(session: Session, ring: Keyring, rows: Sequence[Any]) -> dict[int, SampleRecord]:
    """Open the records of rows selected with `sealed_samples()` (each row carries its wrapped
    key): a payload of its own, or its place in a block (app/core/storage/sample_blocks.py); a row
    whose key is destroyed is left out."""
    out: dict[int, SampleRecord] = {}
    for r in rows:
        if r.wrapped is not None and r.payload is not None:
            key = ring.unwrap(r.wrapped)
            plain = open_sealed(key, r.payload, sample_aad(r.dataset_id, r.external_id))
            out[r.id] = SampleRecord.decode(plain)
    return out | open_records(session, ring, rows)


def _decode(
    session: Session,
    ring: Keyring,
    rows: Sequence[Any],
    shape: list[int],
    into: tuple[np.ndarray, np.ndarray] | None = None,
) -> Arrays:
    """Rows selected with `stored_samples()` opened into arrays, in their order: a row sealed
    on its own decoded alone; a block's rows copied out of its columns together, the block
    opened once (app/core/storage/sample_blocks.py). The rows are taken apart by column and a
    block's rows by runs (a block's rows have consecutive ids), its ids and subjects decoded
    together: the key id per row as a UUID, a Row's attributes, a dict entry and two calls
    per row were most of reading a million rows. `into`: the (rows × features)
    float32 and (rows,) int64 arrays to fill (views of a larger read's), else new ones. Every
    row must open."""
    n = len(rows)
    n_feat = int(np.prod(shape)) if shape else 1
    X, y = into or (np.empty((n, n_feat), dtype=np.float32), np.empty(n, dtype=np.int64))
    external_ids: list[str] = [""] * n
    subjects: list[str | None] = [None] * n
    found = np.zeros(n, dtype=bool)
    ids, dataset_ids, names, payloads, keys, places = (
        list(zip(*rows, strict=True))[:6] if n else ([], [], [], [], [], [])
    )

    def put(i: int, record: SampleRecord) -> None:
        X[i] = np.frombuffer(record.features, dtype=np.float32)
        y[i], external_ids[i], subjects[i] = record.label, record.external_id, record.subject_id
        found[i] = True

    runs = _runs(keys)
    key_of = {raw: uuid.UUID(raw) for raw in {keys[start] for start, _ in runs}}
    wrapped = _wrapped_keys(session, list(key_of.values()))
    in_blocks: dict[uuid.UUID, list[tuple[int, int]]] = {}
    for start, stop in runs:
        key_id = key_of[keys[start]]
        if key_id not in wrapped:  # destroyed: its rows are erased
            continue
        if payloads[start] is not None:  # sealed on its own (registrations before blocks)
            for i in range(start, stop):
                aad = sample_aad(dataset_ids[i], names[i])
                plain = open_sealed(ring.unwrap(wrapped[key_id]), payloads[i], aad)
                put(i, SampleRecord.decode(plain))
        elif places[start] is not None:
            in_blocks.setdefault(key_id, []).append((start, stop))
    for key_id, plain in opened_blocks(session, ring, {k: wrapped[k] for k in in_blocks}):
        block = columns(plain)
        if block is None:  # packed by record: an older registration's, or one rewritten
            records = block_records(plain)
            for start, stop in in_blocks[key_id]:
                for i in range(start, stop):
                    if (record := records[places[i]]) is not None:
                        put(i, record)
            del records
            continue
        all_ids, all_subjects = block.external_ids(), block.subjects_of()
        for start, stop in in_blocks[key_id]:
            taken = np.asarray(places[start:stop])
            X[start:stop], y[start:stop] = block.features[taken], block.labels[taken]
            found[start:stop] = True
            first = int(taken[0])
            if np.array_equal(taken, np.arange(first, first + len(taken))):  # places in order
                external_ids[start:stop] = all_ids[first : first + len(taken)]
                subjects[start:stop] = all_subjects[first : first + len(taken)]
            else:
                for i, place in zip(range(start, stop), taken.tolist(), strict=True):
                    external_ids[i], subjects[i] = all_ids[place], all_subjects[place]
        del block, all_ids, all_subjects
    if not found.all():
        missing = [ids[i] for i in np.flatnonzero(~found)[:10]]
        raise RuntimeError(f"samples {missing} are erased but were asked for")
    return Arrays(
        sample_ids=list(ids),
        external_ids=external_ids,
        X=torch.from_numpy(X.reshape(n, *shape)) if n else torch.zeros((0, *shape)),
        y=torch.from_numpy(y),
        subjects=subjects,
    )


def _runs(keys: Sequence[str | None]) -> list[tuple[int, int]]:
    """(start, stop) of each run of equal key ids (None, a row with no key, in none)."""
    if not keys:
        return []
    at = np.asarray(keys, dtype=object)
    edges = [0, *(np.flatnonzero(at[1:] != at[:-1]) + 1).tolist(), len(keys)]
    return [(a, b) for a, b in itertools.pairwise(edges) if keys[a] is not None]


def _wrapped_keys(session: Session, key_ids: list[uuid.UUID]) -> dict[uuid.UUID, bytes]:
    """The wrapped data keys of these ids that still exist (a destroyed one is missing), read
    once per key, not once per row of its block."""
    found: dict[uuid.UUID, bytes] = {}
    for chunk in chunked(key_ids):
        query = select(DataKey.id, DataKey.wrapped).where(DataKey.id.in_(chunk))
        found.update((k, w) for k, w in session.connection().execute(query) if w is not None)
    return found


def split_rows(
    session: Session, ring: Keyring, rows: Sequence[Any], shape: list[int]
) -> tuple[Arrays, Arrays]:
    """Rows selected with `stored_samples()` and their `split`, opened together (each block
    once) as (training rows, test rows), each in the rows' order: an append's rows as a
    model learns them, read in one query where two `IN` lists of their ids were."""
    opened = _decode(session, ring, rows, shape)
    train = np.asarray([r.split == "train" for r in rows], dtype=bool)
    return _part(opened, np.flatnonzero(train)), _part(opened, np.flatnonzero(~train))


def _part(arrays: Arrays, at: np.ndarray) -> Arrays:
    """These rows of `arrays` (positions ascending)."""
    rows = torch.from_numpy(at.astype(np.int64))
    return Arrays(
        sample_ids=[arrays.sample_ids[i] for i in at],
        external_ids=[arrays.external_ids[i] for i in at],
        X=arrays.X[rows],
        y=arrays.y[rows],
        subjects=[arrays.subjects[i] for i in at],
    )


def database_key(engine: Engine) -> str:
    """Which database a cache entry belongs to (a process may hold models of several)."""
    return engine.url.render_as_string()


def stored_samples() -> Select[int, int, str, bytes | None, str | None, int | None]:
    """Samples as `_decode` reads them in bulk, in this column order (a caller may add
    columns after them): the key id as text, each made a UUID once per block, and no wrapped
    key (read once per key, `_wrapped_keys`), where a UUID and the block's wrapped key were
    made for every row."""
    return select(
        Sample.id,
        Sample.dataset_id,
        # a block row's external_id is its id token, which only a row sealed on its own needs
        # (in its AAD): not read for a million block rows
        case((Sample.payload.is_not(None), Sample.external_id)).label("external_id"),
        Sample.payload,
        cast(Sample.key_id, String).label("key_id"),
        Sample.block_row,
    )


def sealed_samples() -> Select[int, int, str, bytes | None, uuid.UUID | None, bytes, int | None]:
    """Samples with their wrapped data keys (a block's, for a row sealed in one), in one query
    (no second round trip for keys)."""
    return select(
        Sample.id,
        Sample.dataset_id,
        Sample.external_id,
        Sample.payload,
        Sample.key_id,
        DataKey.wrapped,
        Sample.block_row,
    ).outerjoin(DataKey, DataKey.id == Sample.key_id)


class OpenedSamples:
    """Samples this process has opened, per database, dataset and part (a model's training rows
    or the test split), as contiguous arrays: an update used to decrypt and decode
    the whole training set each time, most of its cost on small models. Each load reads the
    ids it needs and the dataset's erased ids, opens what is new, and drops every cached
    sample whose key is gone from every part of the dataset, so erased plaintext does not
    outlive the next load of its dataset in any worker. Blocks are keyed by the dataset's id
    and creation time, so a reused id is never mistaken for an old dataset's sample.

    The parts are kept apart so a load never concatenates the training rows with the test
    split (at a million rows that merge and its reordering were two more copies of all the
    data), and a part asked for whole comes back without a copy where its
    caller cannot write to the cache's rows: the test split (`shared`, read only) or training
    rows handed over to a resident session (`hand_over`: the cache forgets them, so the
    session's in-place erasure of a removed row never reaches another reader)."""

    def __init__(self, ring: Keyring) -> None:
        self.ring = ring
        self._lock = threading.Lock()
        self._blocks: dict[tuple[str, int, str, str], _Block] = {}

    def arrays(
        self,
        session: Session,
        dataset: Dataset,
        ids: list[int],
        part: str,
        *,
        shared: bool = False,
        hand_over: bool = False,
    ) -> Arrays:
        """These samples (ids ascending), opened once per process. `shared`: the caller only
        reads the arrays (they may be the cache's own); `hand_over`: the caller keeps them and
        the cache drops this part."""
        # Only the dataset's erased ids come back (usually few): reading every (id, key id)
        # pair was most of an update's time at n = 100,000.
        erased = np.fromiter(
            session.scalars(
                select(Sample.id).where(Sample.dataset_id == dataset.id, Sample.key_id.is_(None))
            ),
            dtype=np.int64,
        )
        here = (
            database_key(session.get_bind().engine),
            dataset.id,
            dataset.created_at.isoformat(),  # a dataset id reused after a delete starts afresh
        )
        where = (*here, part)
        with self._lock, collector.paused():  # millions of short-lived rows, no cycles
            for key, cached in list(self._blocks.items()):  # erased rows leave every part
                if key[:3] == here:
                    self._blocks[key] = cached.drop(erased)
            block = self._blocks.pop(where, None) or _Block.empty(dataset.feature_shape)
            new = block.missing(ids)
            if new:
                block = block.merge(_open_new(session, self.ring, dataset, new))
            if not hand_over:
                self._blocks[where] = block
        return block.take(ids, copy=not (shared or hand_over))

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()

    def forget(self, where: str, dataset_id: int, part: str) -> None:
        """Drop a dataset's opened `part` (a resident session grew its own copy of it: the
        cache's would be a second one; a later reader opens it again)."""
        with self._lock:
            for key in [k for k in self._blocks if k[:2] == (where, dataset_id) and k[3] == part]:
                del self._blocks[key]


SPARE_SHARE = 8  # opened rows keep room for 1/8 more after them: a session's appends go there


def _open_new(session: Session, ring: Keyring, dataset: Dataset, new: list[int]) -> Arrays:
    """These samples (ids ascending) opened a chunk at a time into one preallocated array: the
    sealed bytes of one chunk are held at once, not of all of them (1.1 GB of
    ciphertext and 1 GB of plaintext records at a million rows)."""
    shape = dataset.feature_shape
    n_feat = int(np.prod(shape)) if shape else 1
    # room after the rows for a resident session's appends (workers/resident.extended): the
    # OS maps its pages only once an append writes them
    room = np.empty((len(new) + len(new) // SPARE_SHARE, n_feat), dtype=np.float32)
    X = room[: len(new)]
    y = np.empty(len(new), dtype=np.int64)
    sample_ids: list[int] = []
    external_ids: list[str] = []
    subjects: list[str | None] = []
    at = 0
    for chunk in chunked(new):
        rows = _sealed_rows(session, chunk)
        m = len(rows)
        part = _decode(session, ring, rows, shape, (X[at : at + m], y[at : at + m]))
        sample_ids += part.sample_ids
        external_ids += part.external_ids
        subjects += part.subjects
        at += m
    if at != len(new):
        raise RuntimeError("samples are erased but were asked for")
    features = torch.from_numpy(room.reshape(len(room), *shape))[: len(new)]
    return Arrays(sample_ids, external_ids, features, torch.from_numpy(y), subjects)


SPARSE = 4  # ids spread over more than this many times their count are read by `IN`


def _sealed_rows(session: Session, ids: list[int]) -> list[Any]:
    """The rows of these ids (ascending) as `stored_samples()` selects them, in id order: ids
    that fill at least a quarter of their range (a shard's rows, a model's among the test
    split's) read as one range and filtered, sparser ones by `IN`; through the session's
    connection, with no ORM processing of each row (compiling 5,000-id `IN` lists and the
    ORM's per-row work were most of reading a million-row model's rows)."""
    if not ids:
        return []
    query, run = stored_samples().order_by(Sample.id), ids[-1] - ids[0] + 1
    if run > SPARSE * len(ids):
        return list(session.connection().execute(query.where(Sample.id.in_(ids))).all())
    found = session.connection().execute(query.where(Sample.id.between(ids[0], ids[-1]))).all()
    if run == len(ids):  # every id of the range asked for
        return list(found)
    wanted = set(ids)
    return [r for r in found if r[0] in wanted]


@dataclass
class _Block:
    """One dataset's opened samples, rows in ascending id order, indexed by a sorted id array
    (no Python loop over the samples)."""

    ids: np.ndarray  # int64, ascending
    external_ids: np.ndarray  # object
    subjects: np.ndarray  # object
    X: torch.Tensor
    y: torch.Tensor

    @classmethod
    def empty(cls, shape: list[int]) -> _Block:
        return cls.of(
            Arrays([], [], torch.zeros((0, *shape)), torch.zeros(0, dtype=torch.long), [])
        )

    @classmethod
    def of(cls, arrays: Arrays) -> _Block:
        """From rows already in ascending id order."""
        return cls(
            np.asarray(arrays.sample_ids, dtype=np.int64),
            object_array(arrays.external_ids),
            object_array(arrays.subjects),
            arrays.X,
            arrays.y,
        )

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def missing(self, ids: list[int]) -> list[int]:
        """Those of `ids` not opened here, ascending, without repeats."""
        wanted = np.asarray(ids, dtype=np.int64)
        increasing = bool(np.all(wanted[1:] > wanted[:-1]))
        if not len(self) and increasing:  # nothing opened yet: all of them (as callers ask)
            return ids if isinstance(ids, list) else wanted.tolist()
        wanted = wanted if increasing else np.unique(wanted)
        return np.setdiff1d(wanted, self.ids, assume_unique=True).tolist()

    def drop(self, erased: np.ndarray) -> _Block:
        gone = np.isin(self.ids, erased)
        if not gone.any():
            return self
        return self._rows(np.flatnonzero(~gone))

    def merge(self, more: Arrays) -> _Block:
        """These rows and `more`'s (both in ascending id order, no id in both), written once
        into arrays of the merged size: no concatenation reordered afterwards."""
        if not len(self):  # nothing opened yet: `more` is already in id order
            return _Block.of(more)
        other = _Block.of(more)
        n = len(self) + len(other)
        mine = np.arange(len(self)) + np.searchsorted(other.ids, self.ids)
        theirs = np.arange(len(other)) + np.searchsorted(self.ids, other.ids)
        ids = np.empty(n, dtype=np.int64)
        external_ids = np.empty(n, dtype=object)
        subjects = np.empty(n, dtype=object)
        X = self.X.new_empty((n, *self.X.shape[1:]))
        y = self.y.new_empty(n)
        for at, part in ((mine, self), (theirs, other)):
            ids[at], external_ids[at], subjects[at] = part.ids, part.external_ids, part.subjects
            rows = torch.from_numpy(at)
            X[rows], y[rows] = part.X, part.y
        return _Block(ids, external_ids, subjects, X, y)

    def take(self, ids: list[int], copy: bool = True) -> Arrays:
        """These rows; all of them in order come back as the block's own arrays unless `copy`."""
        wanted = np.asarray(ids, dtype=np.int64)
        if not copy and np.array_equal(wanted, self.ids):
            return self.arrays()
        at = np.searchsorted(self.ids, wanted)
        found = at < len(self)
        found[found] = self.ids[at[found]] == wanted[found]
        if not found.all():
            missing = wanted[~found][:10].tolist()
            raise RuntimeError(f"samples {missing} are erased but were asked for")
        return self._rows(at).arrays()

    def _rows(self, at: np.ndarray) -> _Block:
        rows = torch.from_numpy(at.astype(np.int64))
        return _Block(
            self.ids[at], self.external_ids[at], self.subjects[at], self.X[rows], self.y[rows]
        )

    def arrays(self) -> Arrays:
        return Arrays(
            self.ids.tolist(), self.external_ids.tolist(), self.X, self.y, self.subjects.tolist()
        )


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A list as a numpy object array (rows are taken by index arrays, not Python loops)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def training_arrays(
    session: Session,
    opened: OpenedSamples,
    model_id: int,
    dataset: Dataset,
    exclude: set[int] | None = None,
    hand_over: bool = False,
) -> Arrays:
    """Samples the model still holds (ordered by id), minus `exclude`. `hand_over`: for a
    resident session, which keeps them (and erases removed rows in place): the opened-samples
    cache gives them up instead of keeping a second copy."""
    ids = (
        session.connection()
        .execute(
            select(ModelSample.sample_id)
            .where(ModelSample.model_id == model_id, ModelSample.removed_version_id.is_(None))
            .order_by(ModelSample.sample_id)
        )
        .scalars()
        .all()
    )
    exclude = exclude or set()
    kept = [s for s in ids if s not in exclude]
    return opened.arrays(session, dataset, kept, "train", hand_over=hand_over)


def test_arrays(session: Session, opened: OpenedSamples, dataset: Dataset) -> Arrays:
    """The test split's active samples: none that a request has asked to forget (`erasing`),
    so no version is ever scored on rows its own request erases. Read only: the
    arrays may be the opened-samples cache's own."""
    ids = (
        session.connection()
        .execute(
            select(Sample.id)
            .where(
                Sample.dataset_id == dataset.id,
                Sample.split == "test",
                Sample.status == SampleStatus.active,
                Sample.key_id.is_not(None),
            )
            .order_by(Sample.id)
        )
        .scalars()
        .all()
    )
    return opened.arrays(session, dataset, list(ids), "test", shared=True)
