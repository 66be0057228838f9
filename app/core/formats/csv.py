"""A numeric table in CSV: a header, a label column, the feature columns."""

from __future__ import annotations

from app.core.formats import dataset_files
from app.core.formats.base import Format, TableOptions


def parse(
    data: bytes, o: TableOptions, limits: dataset_files.Limits
) -> dataset_files.ParsedDataset:
    return dataset_files.parse_csv(
        data,
        o.label_column,
        o.id_column,
        o.subject_column,
        o.split_column,
        o.seed,
        o.test_fraction,
        limits,
        list(o.feature_columns),
    )


FORMAT = Format(
    name="csv",
    suffixes=(".csv",),
    options=TableOptions,
    parse=parse,
    summary="a CSV table with a header: label, features, optional id, subject and split",
)
