"""Parquet uploads (issue 55, goal 2): a table with a label column, an optional id, subject
and split column, and the features as one list column (fixed-size, or lists of one length)
or as named numeric columns. Read a row group at a time (pyarrow), never decoded whole;
whatever is malformed is a 422 naming the column and the row."""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app.errors import APIError, unprocessable
from app.services.dataset_files import (
    Limits,
    ParsedDataset,
    check_size,
    finish,
    label_array,
    split_of,
)


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
    data: bytes | io.IOBase, columns: Columns, seed: int, test_fraction: float, limits: Limits
) -> ParsedDataset:
    """The rows of a Parquet file (its bytes, or a seekable file: an object in S3 read by
    ranged GETs) as a dataset (features float32)."""
    try:
        table_file = pq.ParquetFile(pa.BufferReader(data) if isinstance(data, bytes) else data)
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
    ids: list[str] = []
    subjects: list[str | None] = []
    splits: list[str] = []
    start = 0
    for group in range(table_file.num_row_groups):
        try:
            table = table_file.read_row_group(group, columns=columns.named() + features)
        except (pa.ArrowException, OSError) as exc:
            raise unprocessable("malformed_parquet", f"row group {group}: {exc}") from exc
        stop = start + table.num_rows
        # the features are checked here, so a malformed value is refused before anything is
        # written, then dropped: `ParquetRows` reads them again a row group at a time
        _feature_block(table, features, width, start)
        y[start:stop] = _numbers(table.column(columns.label), columns.label, start)
        named = _texts(table, columns.id, start, required=True)
        ids += [str(v) for v in named] if named else [str(i) for i in range(start, stop)]
        subjects += _texts(table, columns.subject, start, required=False) or [None] * (stop - start)
        splits += [str(v) for v in _texts(table, columns.split, start, required=True) or []]
        start = stop
        del table
        pa.default_memory_pool().release_unused()  # Arrow's pool keeps what it freed
    y_int = label_array(y, n)
    split = split_of(np.array(splits) if columns.split else None, y_int, seed, test_fraction)
    return finish(X, y_int, ids, subjects, split, "tabular")  # type: ignore[arg-type]


class ParquetRows:
    """A Parquet file's feature rows as registration reads them (issue 55, goal 6): in order,
    one row group decoded and checked at a time, so the features are never all in memory
    (a million × 256 float32 is 1 GB). Stands in for the (n × width) float32 array of a
    `ParsedDataset`: `shape`, row `i`, and a boolean mask of the rows kept (`on_erased:
    skip`). A malformed value is the same 422 naming its column and row, raised when its
    row group is read."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(
        self,
        table_file: pq.ParquetFile,
        features: list[str],
        width: int,
        rows: np.ndarray | None = None,
    ) -> None:
        self.file, self.features, self.width = table_file, features, width
        sizes = [
            table_file.metadata.row_group(g).num_rows for g in range(table_file.num_row_groups)
        ]
        self.starts = np.cumsum([0, *sizes])
        total = int(self.starts[-1])
        self.rows = np.arange(total) if rows is None else rows  # positions in the file
        self._group: int | None = None
        self._block: np.ndarray | None = None
        self._low, self._high = 0, 0  # the rows of the group in hand

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), self.width)

    def __len__(self) -> int:
        return len(self.rows)

    def astype(self, dtype: object, copy: bool = False) -> ParquetRows:
        """float32 already (what `finish` asks of an array)."""
        return self

    def __getitem__(self, key: object) -> np.ndarray | ParquetRows:
        if isinstance(key, np.ndarray) and key.dtype == bool:
            return ParquetRows(self.file, self.features, self.width, self.rows[key])
        if isinstance(key, int | np.integer):
            at = int(self.rows[key])
            if self._low <= at < self._high:  # the row group in hand (rows come in order)
                assert self._block is not None
                return self._block[at - self._low]
            group = int(np.searchsorted(self.starts, at, side="right") - 1)
            self._block, self._group = self._read(group), group
            self._low, self._high = int(self.starts[group]), int(self.starts[group + 1])
            return self._block[at - self._low]
        raise TypeError(f"ParquetRows takes a row number or a boolean mask, not {type(key)}")

    def _read(self, group: int) -> np.ndarray:
        start = int(self.starts[group])
        self._block = None  # the previous group's rows go before the next is decoded
        try:
            table = self.file.read_row_group(group, columns=self.features)
        except (pa.ArrowException, OSError) as exc:
            raise unprocessable("malformed_parquet", f"row group {group}: {exc}") from exc
        block = _feature_block(table, self.features, self.width, start)
        del table
        pa.default_memory_pool().release_unused()  # Arrow's pool keeps what it freed
        return block


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
    first = table_file.read_row_group(0, columns=features).column(0)
    value = first[0].as_py()
    return len(value) if value is not None else 0


def _feature_block(table: pa.Table, features: list[str], width: int, start: int) -> np.ndarray:
    """One row group's features, (rows × width) float32, checked for nulls, ragged lists and
    non-finite values."""
    if len(features) == 1 and _is_list(table.schema.field(features[0]).type):
        column = table.column(features[0]).combine_chunks()
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


def _texts(
    table: pa.Table, name: str | None, start: int, required: bool
) -> list[str | None] | None:
    """A column's values as text (ids, subjects, splits); None when it is not mapped."""
    if name is None:
        return None
    values = table.column(name).to_pylist()
    if required:
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            raise _bad(name, start + missing[0], "no value")
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
