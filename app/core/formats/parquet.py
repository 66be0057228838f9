"""A numeric table in Parquet, read a row group at a time (from object storage: by ranges)."""

from __future__ import annotations

from typing import Any

from app.core.formats import dataset_files
from app.core.formats.base import Format, TableOptions
from app.core.formats.parquet_files import Columns, parse_parquet


def parse(data: Any, o: TableOptions, limits: dataset_files.Limits) -> dataset_files.ParsedDataset:
    columns = Columns(
        label=o.label_column,
        id=o.id_column,
        subject=o.subject_column,
        split=o.split_column,
        features=tuple(o.feature_columns),
    )
    return parse_parquet(data, columns, o.seed, o.test_fraction, limits)


FORMAT = Format(
    name="parquet",
    suffixes=(".parquet", ".pq"),
    options=TableOptions,
    parse=parse,
    summary="a Parquet table: label, features (columns or one list column), optional ids",
    ranged=True,
)
