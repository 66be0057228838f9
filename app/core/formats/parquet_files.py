"""Parquet uploads: a table with a label column, an optional id, subject
and split column, and the features as one list column (fixed-size, or lists of one length)
or as named numeric columns. Read in batches of about BATCH_BYTES of features through a
READ_BUFFER stream (pyarrow), never a row group whole (reading by row group
held five copies of one, 328 MB for 65 MB groups; this, 90 MB); whatever is malformed is a
422 naming the column and the row: the footer, ids and labels at the parse, a feature when
its batch is read (once, as the rows are registered)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app.core.errors import APIError, unprocessable
from app.core.formats.dataset_files import (
    Limits,
    MaybeTexts,
    ParsedDataset,
    Texts,
    canonical_ids,
    canonical_subjects,
    check_size,
    finish,
    label_array,
    split_of,
)
from app.core.formats.row_stream import RowStream

TEXT = np.dtypes.StringDType()
BATCH_BYTES = 8 << 20  # features decoded at a time (float32)
READ_BUFFER = 4 << 20  # bytes read at a time (one ranged GET for an object in S3)
NAMED_BATCH_ROWS = 8192  # rows of the id, label, subject and split columns at a time


@dataclass(frozen=True)
class Columns:
    """Which column holds what: `features` names one list column or several numeric ones
    (empty: every other numeric column, or the one list column)."""

    label: str = "label"
    id: str | None = None
    subject: str | None = None
    split: str | None = None
    features: tuple[str, ...] = ()

    def named(self) -> list[str]:
        return [c for c in (self.label, self.id, self.subject, self.split) if c]


def parse_parquet(
    data: bytes | io.IOBase,
    columns: Columns,
    seed: int | None,
    test_fraction: float,
    limits: Limits,
) -> ParsedDataset:
    """The rows of a Parquet file (its bytes, or a seekable file: an object in S3 read by
    ranged GETs) as a dataset (features float32)."""
    try:
        source = pa.BufferReader(data) if isinstance(data, bytes) else data
        # pre-buffering reads whole column chunks ahead (all of them, in iter_batches): the
        # buffered stream reads READ_BUFFER at a time instead
        table_file = pq.ParquetFile(source, buffer_size=READ_BUFFER, pre_buffer=False)
        schema = table_file.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise unprocessable("malformed_parquet", f"not a Parquet file: {exc}") from exc
    missing = [c for c in columns.named() + list(columns.features) if c not in schema.names]
    if missing:
        raise unprocessable(
            "missing_column",
            f"column {missing[0]!r} is not in the file",
            {"column": missing[0], "columns": schema.names},
        )
    features = _feature_columns(schema, columns)
    n = table_file.metadata.num_rows
    width = _width(table_file, schema, features)
    check_size(n, width, limits)
    X = ParquetRows(table_file, features, width)
    y = np.empty(n, dtype=np.float64)
    ids: list[np.ndarray] = []  # per batch, joined into one compact array (`Texts`)
    subjects: list[np.ndarray] = []  # per batch, joined into one compact array (`MaybeTexts`)
    splits: list[str] = []
    written_ids: dict[int, str] = {}  # rows whose ids Lethe wrote otherwise before
    written_subjects: dict[int, str] = {}
    # the named columns only: the features are read once, a batch at a time as they are
    # registered (`ParquetRows`), and a malformed value is refused then (the job fails and
    # is discarded). Reading them here as well read the features twice, before a POST could
    # answer 202
    for start, table in batches(table_file, columns.named(), width, NAMED_BATCH_ROWS):
        stop = start + table.num_rows
        y[start:stop] = _numbers(table.column(columns.label), columns.label, start)
        named = _values(table, columns.id, start, required=True)
        if named is None:
            ids.append(np.arange(start, stop).astype(TEXT))
        else:
            texts, before = canonical_ids(named, columns.id or "ids", start)
            ids.append(np.array(texts, dtype=TEXT))
            written_ids |= before
        if columns.subject:
            values = _values(table, columns.subject, start, required=False) or []
            found, before = canonical_subjects(values, columns.subject, start)
            subjects.append(np.array(found, dtype=MaybeTexts.DTYPE))
            written_subjects |= before
        splits += [str(v) for v in _texts(table, columns.split, start, required=True) or []]
        del table
    pa.default_memory_pool().release_unused()  # Arrow's pool keeps what it freed
    y_int = label_array(y, n)
    split = split_of(np.array(splits) if columns.split else None, y_int, seed, test_fraction)
    parsed = finish(
        X,  # type: ignore[arg-type]
        y_int,
        Texts.joined(ids),
        MaybeTexts.joined(subjects) if columns.subject else [None] * n,
        split,
        "tabular",
    )
    return replace(parsed, written_ids=written_ids, written_subjects=written_subjects)


def batches(
    table_file: pq.ParquetFile, columns: list[str], width: int, size: int | None = None
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """The file's rows of `columns` in batches of about BATCH_BYTES of features (`width`
    float32 a row), or of `size` rows, each with the number of its first row; a file that
    cannot be decoded is a 422."""
    start = 0
    rows = size or max(1, BATCH_BYTES // max(1, 4 * width))
    reader = table_file.iter_batches(batch_size=rows, columns=columns, use_threads=False)
    while True:
        try:
            batch = next(reader, None)
        except (pa.ArrowException, OSError) as exc:
            raise unprocessable("malformed_parquet", f"rows from {start}: {exc}") from exc
        if batch is None:
            return
        yield start, batch
        start += batch.num_rows


class ParquetRows(RowStream):
    """A Parquet file's feature rows as registration reads them: in order,
    one batch decoded and checked at a time (app/core/formats/row_stream.py), so the features are
    never all in memory. A malformed value is the same 422 naming its column and row, raised
    when its batch is read."""

    def __init__(
        self,
        table_file: pq.ParquetFile,
        features: list[str],
        width: int,
        rows: np.ndarray | None = None,
    ) -> None:
        super().__init__(int(table_file.metadata.num_rows), width, rows)
        self.file, self.features = table_file, features

    def _open(self) -> ReadAhead:
        return ReadAhead(self.file, self.features, self.width)

    def _with_rows(self, rows: np.ndarray) -> ParquetRows:
        return ParquetRows(self.file, self.features, self.width, rows)

    def release(self) -> None:
        """Let go of the batch in hand and the reader, and give Arrow's freed memory back:
        the rows are all read (a registration's last phase has its own memory to hold)."""
        super().release()
        pa.default_memory_pool().release_unused()


class ReadAhead:
    """A file's feature batches in order, (first row, rows × width float32), each decoded
    and checked on a thread of its own while the caller works on the one before: reading
    an object in S3 and decoding it was a third of a million-row registration's sealing
    thread, and pyarrow and numpy do most of it without Python's lock.
    One batch ahead at most (BATCH_BYTES more memory); a malformed one raises its 422 when
    the caller comes to it."""

    def __init__(self, table_file: pq.ParquetFile, features: list[str], width: int) -> None:
        self._source = batches(table_file, features, width)
        self.features, self.width = features, width
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lethe-parquet")
        self._next: Future[tuple[int, np.ndarray] | None] | None = self._pool.submit(self._decode)

    def _decode(self) -> tuple[int, np.ndarray] | None:
        found = next(self._source, None)
        if found is None:
            return None
        start, batch = found
        return start, _feature_block(batch, self.features, self.width, start)

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]:
        while self._next is not None:
            found = self._next.result()
            self._next = None if found is None else self._pool.submit(self._decode)
            if found is None:
                return
            yield found

    def close(self) -> None:
        """Stop reading: the batch under way is finished and dropped."""
        pending, self._next = self._next, None
        if pending is not None:
            pending.cancel()
        self._pool.shutdown(wait=True)


def _feature_columns(schema: pa.Schema, columns: Columns) -> list[str]:
    """The feature columns: as mapped, else the one list column, else every other numeric."""
    if columns.features:
        chosen = list(columns.features)
    else:
        others = [f for f in schema if f.name not in columns.named()]
        lists = [f.name for f in others if _is_list(f.type)]
        chosen = lists[:1] if len(lists) == 1 else [f.name for f in others if _is_number(f.type)]
    if not chosen:
        raise unprocessable("no_features", "no feature columns: map them with feature_columns")
    for name in chosen:
        kind = schema.field(name).type
        one_list = len(chosen) == 1 and _is_list(kind) and _is_number(kind.value_type)
        if not (_is_number(kind) or one_list):
            raise unprocessable(
                "bad_dtype",
                f"feature column {name!r} is {kind}: give numbers, or one list of numbers",
                {"column": name},
            )
    return chosen


def _width(table_file: pq.ParquetFile, schema: pa.Schema, features: list[str]) -> int:
    """Features per row: the columns' count, a fixed-size list's size, or the length of the
    first row of a list column (every row is held to it)."""
    kind = schema.field(features[0]).type
    if not _is_list(kind):
        return len(features)
    if pa.types.is_fixed_size_list(kind):
        return int(kind.list_size)
    if table_file.metadata.num_rows == 0:
        return 0
    first = next(table_file.iter_batches(batch_size=1, columns=features, use_threads=False))
    value = first.column(0)[0].as_py()
    return len(value) if value is not None else 0


def _feature_block(
    table: pa.RecordBatch, features: list[str], width: int, start: int
) -> np.ndarray:
    """One batch's features, (rows × width) float32, checked for nulls, ragged lists and
    non-finite values."""
    if len(features) == 1 and _is_list(table.schema.field(features[0]).type):
        column = table.column(features[0])
        if column.null_count:
            row = start + int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
            raise _bad(features[0], row, "no feature list")
        if not pa.types.is_fixed_size_list(column.type):
            offsets = column.offsets.to_numpy()
            lengths = np.diff(offsets)
            ragged = np.flatnonzero(lengths != width)
            if len(ragged):
                row = int(ragged[0])
                raise _bad(
                    features[0], start + row, f"{lengths[row]} features; the first row has {width}"
                )
            values = column.values.slice(offsets[0], offsets[-1] - offsets[0])
        else:
            values = column.values.slice(column.offset * width, len(column) * width)
        block = _numbers(values, features[0], start, per_row=width, dtype=np.float32)
        return block.reshape(len(column), width)
    return np.stack(
        [_numbers(table.column(name), name, start, dtype=np.float32) for name in features],
        axis=1,
    ).reshape(table.num_rows, width)


def _numbers(
    array: pa.Array | pa.ChunkedArray,
    name: str,
    start: int,
    per_row: int = 1,
    dtype: type[np.floating] = np.float64,
) -> np.ndarray:
    """A numeric column as `dtype` (features: float32, what is stored, with no float64 copy
    of a row group on the way); a null or non-finite value is a 422 naming its row."""
    if not _is_number(array.type):
        raise unprocessable(
            "bad_dtype", f"column {name!r} is {array.type}, not numbers", {"column": name}
        )
    values = array.to_numpy(zero_copy_only=False).astype(dtype, copy=False)  # nulls: NaN
    bad = np.flatnonzero(~np.isfinite(values))
    if len(bad):
        raise _bad(name, start + int(bad[0]) // per_row, "a missing, NaN or infinite value")
    return values


def _values(
    table: pa.RecordBatch, name: str | None, start: int, required: bool
) -> list[Any] | None:
    """A column's values as Python values (ids, subjects: typed, for their canonical text);
    None when it is not mapped."""
    if name is None:
        return None
    values = table.column(name).to_pylist()
    if required:
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            raise _bad(name, start + missing[0], "no value")
    return values


def _texts(
    table: pa.RecordBatch, name: str | None, start: int, required: bool
) -> list[str | None] | None:
    """A column's values as text (splits); None when it is not mapped."""
    values = _values(table, name, start, required)
    if values is None:
        return None
    return [None if v is None else str(v) for v in values]


def _bad(column: str, row: int, what: str) -> APIError:
    return unprocessable(
        "malformed_parquet", f"column {column!r}, row {row}: {what}", {"column": column, "row": row}
    )


def _is_list(kind: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    )


def _is_number(kind: pa.DataType) -> bool:
    return bool(pa.types.is_integer(kind) or pa.types.is_floating(kind))
