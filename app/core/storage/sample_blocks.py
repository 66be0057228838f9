"""Samples sealed a block at a time: a registration seals BLOCK_ROWS rows'
records (label, raw ids, float32 features) together under one data key, the block's key,
where it made, wrapped, sealed and stored a key for every row (a third of its time at a
million rows).

A block is its key: `sample_blocks.key_id` is the block's primary key and each of its rows'
`samples.key_id`, so every reader that joins a sample to its key finds the block's, and
`key_id IS NULL` still means erased. A sample's statistics are sealed with the same key.
Erasing a row rewrites its block (`rewrite`): the block is opened, the row's record
dropped, the rest sealed under a new key, the block's other rows and their statistics moved
to it, and the old key destroyed with the row's — in the erasure's own transaction, so the
erased record is in no block any key opens. The plaintext opened on the way is zeroed.
Rows appended later keep a key of their own (`samples.block_row` is NULL).

A block's plaintext is packed by column (`pack_columns`: a registration's) or by record
(`pack`: registrations before, and a block sealed again after an erasure, whose dropped rows
are empty records); `block_records` and `unpack` read both."""

from __future__ import annotations

import ctypes
import itertools
import logging
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import numpy as np
from sqlalchemy import Connection, bindparam, delete, select, update
from sqlalchemy.orm import Session

from app.core.db.bulk import driver_uuids, insert_rows
from app.core.db.chunks import chunked
from app.core.db.tables import Base, SampleBlock
from app.core.storage.crypto import (
    RECORD_HEADER,
    Keyring,
    SampleRecord,
    SealError,
    open_sealed,
    seal,
    statistic_aad,
)
from app.core.storage.keystore import load_keys, new_keys, store_keys

log = logging.getLogger("lethe.erasure")
BLOCK_ROWS = 64  # rows per block: an erasure rewrites one (64 KB at 256 features)
_COUNT = struct.Struct("<I")
# A block packed by column (`pack_columns`) starts with this word; one packed by record
# (`pack`), with its count of records, at most BLOCK_ROWS.
COLUMNS = 0xFFFF_FF02
_COLUMNS_HEAD = struct.Struct("<II")
_BYTES_DATA = bytes.__basicsize__ - 1  # where a bytes object's data starts (CPython)
_SAMPLES = Base.metadata.tables["samples"]
_STATISTICS = Base.metadata.tables["sample_statistics"]
_BLOCKS = Base.metadata.tables["sample_blocks"]


def block_aad(dataset_id: int, key_id: UUID) -> str:
    """A block's bytes belong to its dataset and open under its own key only."""
    return f"block/{dataset_id}/{key_id.hex}"


def pack(records: Sequence[bytes | memoryview]) -> bytes:
    """Records as one plaintext: their count, their end offsets, then the records."""
    ends, at = [], 0
    for r in records:
        at += len(r)
        ends.append(at)
    head = _COUNT.pack(len(records)) + struct.pack(f"<{len(records)}I", *ends)
    return b"".join([head, *records])


def pack_columns(
    labels: Sequence[int],
    ids: Sequence[bytes],
    subjects: Sequence[bytes | None],
    features: bytes | memoryview,
) -> bytes:
    """Rows as one plaintext by column, as a registration seals them: a header (COLUMNS, the
    row count), the labels, the ends of the ids and of the subjects, which rows have a
    subject, then the ids, the subjects and the features (`features`: the rows' float32
    features, row after row), each a run of its own. A few joins a block, where packing it
    by record (a record's parts and a view of its features a row) was a large share of a
    registration's sealing thread. `unpack` reads both layouts."""
    given = [b"" if s is None else s for s in subjects]
    return b"".join(
        [
            _COLUMNS_HEAD.pack(COLUMNS, len(labels)),
            np.asarray(labels, dtype="<i8").tobytes(),
            np.cumsum(list(map(len, ids)), dtype="<u4").tobytes(),
            np.cumsum(list(map(len, given)), dtype="<u4").tobytes(),
            bytes(s is not None for s in subjects),
            b"".join(ids),
            b"".join(given),
            features,
        ]
    )


def block_records(plain: bytes) -> list[SampleRecord | None]:
    """A block's rows as records, in place order (None: a row dropped by an erasure)."""
    if _COUNT.unpack_from(plain)[0] != COLUMNS:
        return [SampleRecord.decode(bytes(r)) if len(r) else None for r in _unpack_records(plain)]
    return [
        SampleRecord(
            label,
            str(external_id, "utf-8"),
            str(subject, "utf-8") if given else None,
            bytes(features),
        )
        for label, external_id, subject, given, features in _columns(plain)
    ]


@dataclass(frozen=True)
class Columns:
    """A block packed by column, read as arrays (views into its plaintext, which the caller
    zeroes after copying out what it needs): a worker opening a million rows copies each
    block's features and labels out in one operation, where making a record for every row
    and copying its features twice was most of reading a model's rows (a million-row
    session's warm-up)."""

    labels: np.ndarray  # (count,) int64
    features: np.ndarray  # (count, width) float32
    id_ends: list[int]  # [0, end of row 0's id, …]
    subject_ends: list[int]
    given: memoryview  # 1 where the row has a subject
    ids: memoryview
    subjects: memoryview

    def external_id(self, row: int) -> str:
        return str(self.ids[self.id_ends[row] : self.id_ends[row + 1]], "utf-8")

    def subject(self, row: int) -> str | None:
        if not self.given[row]:
            return None
        return str(self.subjects[self.subject_ends[row] : self.subject_ends[row + 1]], "utf-8")

    def external_ids(self) -> list[str]:
        """Every row's id, in place order, decoded together."""
        return _texts(self.ids, self.id_ends)

    def subjects_of(self) -> list[str | None]:
        """Every row's subject (None where it has none), in place order."""
        texts = _texts(self.subjects, self.subject_ends)
        return [text if given else None for text, given in zip(texts, self.given, strict=True)]


def _texts(joined: memoryview, ends: list[int]) -> list[str]:
    """The strings at [ends[i], ends[i + 1]) of UTF-8 bytes: decoded once and sliced where
    they are ASCII (a byte is a character), else one at a time."""
    text = str(joined, "utf-8")
    if len(text) == len(joined):
        return [text[a:b] for a, b in itertools.pairwise(ends)]
    return [str(joined[a:b], "utf-8") for a, b in itertools.pairwise(ends)]


def columns(plain: bytes) -> Columns | None:
    """The block's columns, or None for a block packed by record (`block_records` reads it)."""
    if _COUNT.unpack_from(plain)[0] != COLUMNS:
        return None
    (_, count), at = _COLUMNS_HEAD.unpack_from(plain), _COLUMNS_HEAD.size
    labels = np.frombuffer(plain, "<i8", count, at)
    at += 8 * count
    id_ends = [0, *np.frombuffer(plain, "<u4", count, at).tolist()]
    at += 4 * count
    subject_ends = [0, *np.frombuffer(plain, "<u4", count, at).tolist()]
    at += 4 * count
    view = memoryview(plain)
    given, at = view[at : at + count], at + count
    ids, at = view[at : at + id_ends[-1]], at + id_ends[-1]
    subjects, at = view[at : at + subject_ends[-1]], at + subject_ends[-1]
    width = (len(plain) - at) // 4 // max(1, count)
    features = np.frombuffer(plain, "<f4", count * width, at).reshape(count, width)
    return Columns(labels, features, id_ends, subject_ends, given, ids, subjects)


def unpack(plain: bytes) -> list[bytes | memoryview]:
    """A block's records, each as `SampleRecord.encode` makes it (b"": a dropped row): views
    into `plain` for a block packed by record, new bytes for one packed by column, which
    the caller zeroes (`wipe`) with `plain` after."""
    if _COUNT.unpack_from(plain)[0] != COLUMNS:
        return list(_unpack_records(plain))
    out: list[bytes | memoryview] = []
    for label, external_id, subject, given, features in _columns(plain):
        head = RECORD_HEADER.pack(label, len(external_id), len(subject) + 1 if given else 0)
        out.append(b"".join([head, external_id, subject, features]))
        wipe(head)
    return out


def _columns(plain: bytes) -> list[tuple[int, memoryview, memoryview, bool, memoryview]]:
    """A block packed by column, row by row: (label, id, subject, whether it has one,
    features), the bytes as views into `plain` (no copy of another row's ids)."""
    block = columns(plain)
    assert block is not None, "a block packed by record"
    labels, id_ends, subject_ends = block.labels.tolist(), block.id_ends, block.subject_ends
    return [
        (
            labels[i],
            block.ids[id_ends[i] : id_ends[i + 1]],
            block.subjects[subject_ends[i] : subject_ends[i + 1]],
            bool(block.given[i]),
            memoryview(block.features[i]).cast("B"),
        )
        for i in range(len(labels))
    ]


def _unpack_records(plain: bytes) -> list[memoryview]:
    """`pack`'s records, as views into `plain`."""
    (count,) = _COUNT.unpack_from(plain)
    ends = struct.unpack_from(f"<{count}I", plain, _COUNT.size)
    view, start = memoryview(plain)[_COUNT.size + 4 * count :], 0
    out = []
    for end in ends:
        out.append(view[start:end])
        start = end
    return out


def wipe(data: bytes) -> None:
    """Zero a bytes object's contents in place (CPython): plaintext about to be freed."""
    if len(data) > 1:
        ctypes.memset(id(data) + _BYTES_DATA, 0, len(data))


def open_block(raw: bytes, dataset_id: int, key_id: UUID, sealed: bytes) -> bytes:
    return open_sealed(raw, sealed, block_aad(dataset_id, key_id))


def block_rows(
    conn: Connection, dataset_id: int, blocks: Iterable[tuple[UUID, bytes, bytes]]
) -> None:
    """Seal and insert blocks [(key id, raw key, packed plaintext)] of `dataset_id`."""
    uuid_of = driver_uuids(conn)
    rows = [
        (uuid_of(key_id), dataset_id, seal(raw, plain, block_aad(dataset_id, key_id)))
        for key_id, raw, plain in blocks
    ]
    insert_rows(conn, _BLOCKS, ("key_id", "dataset_id", "data"), rows)


def open_records(session: Session, ring: Keyring, rows: Sequence[Any]) -> dict[int, SampleRecord]:
    """The records of block rows (`id`, `key_id`, `wrapped`, `block_row`; a row whose key is
    destroyed is left out), each block opened once and its plaintext zeroed after."""
    wanted: dict[UUID, list[Any]] = {}
    for r in rows:
        if r.wrapped is not None and r.block_row is not None:
            wanted.setdefault(r.key_id, []).append(r)
    out: dict[int, SampleRecord] = {}
    for key_id, plain in opened_blocks(session, ring, {k: v[0].wrapped for k, v in wanted.items()}):
        records = block_records(plain)
        for r in wanted[key_id]:
            record = records[r.block_row]
            if record is not None:
                out[r.id] = record
        del records
    return out


def opened_blocks(
    session: Session, ring: Keyring, wrapped: dict[UUID, bytes]
) -> Iterator[tuple[UUID, bytes]]:
    """The blocks of these keys ({block key: its wrapped key}) opened one at a time, a chunk
    of them read at once; each block's plaintext is zeroed when the next is asked for."""
    for keys in chunked(list(wrapped)):
        found = session.execute(
            select(SampleBlock.key_id, SampleBlock.dataset_id, SampleBlock.data).where(
                SampleBlock.key_id.in_(keys)
            )
        ).all()
        for key_id, dataset_id, sealed in found:
            plain = open_block(ring.unwrap(wrapped[key_id]), dataset_id, key_id, sealed)
            try:
                yield key_id, plain
            finally:
                wipe(plain)


# built once (building a statement cost more than running it); no parameter is
# named after a column of the table it updates (SQLAlchemy would add it to the SET)
_READ_BLOCKS = select(_BLOCKS.c.key_id, _BLOCKS.c.dataset_id, _BLOCKS.c.data).where(
    _BLOCKS.c.key_id.in_(bindparam("keys", expanding=True))
)
_LOCKED_BLOCKS = _READ_BLOCKS.with_for_update()
_DELETE_BLOCK = delete(_BLOCKS).where(_BLOCKS.c.key_id == bindparam("old_key"))
_MOVE_ROWS = (
    update(_SAMPLES)
    .where(_SAMPLES.c.key_id == bindparam("old_key"))
    .values(key_id=bindparam("new_key"))
)
_MOVED_STATISTICS = select(
    _STATISTICS.c.model_id, _STATISTICS.c.sample_id, _STATISTICS.c.kind, _STATISTICS.c.vector
).where(
    _STATISTICS.c.sample_id.in_(
        select(_SAMPLES.c.id).where(_SAMPLES.c.key_id == bindparam("new_key")).scalar_subquery()
    )
)
_RESEAL = (
    update(_STATISTICS)
    .where(
        _STATISTICS.c.model_id == bindparam("model"),
        _STATISTICS.c.sample_id == bindparam("sample"),
        _STATISTICS.c.kind == bindparam("of_kind"),
    )
    .values(vector=bindparam("sealed"))
)


def rewrite(session: Session, ring: Keyring, erased: dict[UUID, list[int]]) -> list[UUID]:
    """Drop the rows `erased` ({block key: [block_row, ...]}, rows already marked erased) from
    their blocks: each block left with rows is sealed under a new key that its rows and their
    statistics move to. Returns the old keys, for the caller to destroy in this transaction."""
    if not erased:
        return []
    conn = session.connection()
    old_keys = list(erased)
    raws = load_keys(session, ring, old_keys)
    # PostgreSQL: two erasures of one block, one after the other (erase_payloads locked first)
    query = _LOCKED_BLOCKS if conn.dialect.name == "postgresql" else _READ_BLOCKS
    for keys in chunked(old_keys):
        for key_id, dataset_id, sealed in conn.execute(query, {"keys": keys}).all():
            _rewrite_one(conn, ring, key_id, dataset_id, sealed, raws, erased[key_id])
    return old_keys


def _rewrite_one(
    conn: Connection,
    ring: Keyring,
    key_id: UUID,
    dataset_id: int,
    sealed: bytes,
    raws: dict[UUID, bytes],
    gone: list[int],
) -> None:
    conn.execute(_DELETE_BLOCK, {"old_key": key_id})
    if key_id not in raws:  # its key is gone already: nothing to keep
        return
    try:
        plain = open_block(raws[key_id], dataset_id, key_id, sealed)
    except SealError:  # erasure never waits on the block: its other rows were lost already
        log.error("block %s of dataset %s does not open; erased with its rows", key_id, dataset_id)
        return
    records = unpack(plain)
    dropped = set(gone)
    kept = [b"" if i in dropped else r for i, r in enumerate(records)]
    if any(len(r) for r in kept):
        ((new_id, new_raw, _),) = fresh = new_keys(ring, 1)
        store_keys(conn, ring, fresh)
        packed = pack(kept)  # positions kept: the other rows' block_row stays right
        block_rows(conn, dataset_id, [(new_id, new_raw, packed)])
        wipe(packed)
        conn.execute(_MOVE_ROWS, {"old_key": key_id, "new_key": new_id})
        _reseal_statistics(conn, raws[key_id], new_raw, new_id)
    for record in records:  # a block packed by column: its records were made anew
        if isinstance(record, bytes):
            wipe(record)
    del records, kept
    wipe(plain)


def _reseal_statistics(conn: Connection, old: bytes, new: bytes, new_key: UUID) -> None:
    """The statistics of the rows now under `new_key`, sealed again under it."""
    resealed = []
    for model_id, sample_id, kind, vector in conn.execute(_MOVED_STATISTICS, {"new_key": new_key}):
        aad = statistic_aad(model_id, sample_id, kind)
        try:
            plain = open_sealed(old, vector, aad)
        except SealError:  # unreadable already: left under the old key, destroyed with it
            log.error("statistic %s of sample %s does not open; left behind", kind, sample_id)
            continue
        resealed.append(
            {
                "model": model_id,
                "sample": sample_id,
                "of_kind": kind,
                "sealed": seal(new, plain, aad),
            }
        )
        wipe(plain)
    if resealed:
        conn.execute(_RESEAL, resealed)


def destroy_blocks(session: Session, key_ids: Sequence[UUID]) -> None:
    """Delete the blocks sealed under these keys (a discarded registration's)."""
    for keys in chunked(list(key_ids)):
        session.execute(delete(SampleBlock).where(SampleBlock.key_id.in_(keys)))
