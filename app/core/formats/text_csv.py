"""A text corpus in CSV: one document a row, counted into a vocabulary (topic models)."""

from __future__ import annotations

from pydantic import Field

from app.core.formats import dataset_files
from app.core.formats.base import Column, ColumnOptions, Format


class TextOptions(ColumnOptions):
    """A corpus's columns and its vocabulary's threshold."""

    text_column: Column = "text"
    """the document column"""
    label_column: Column | None = None
    """a label column (a topic head's targets), if any"""
    min_count: int = Field(1, ge=1, le=1_000_000)
    """words seen fewer times are left out of the vocabulary"""


def parse(data: bytes, o: TextOptions, limits: dataset_files.Limits) -> dataset_files.ParsedDataset:
    return dataset_files.parse_text_csv(
        data,
        o.text_column,
        o.label_column,
        o.id_column,
        o.subject_column,
        o.split_column,
        o.seed,
        o.test_fraction,
        o.min_count,
        limits,
    )


FORMAT = Format(
    name="text_csv",
    suffixes=(),  # chosen by name: a corpus is a .csv too
    options=TextOptions,
    parse=parse,
    summary="a text corpus in CSV, a document a row, counted into a vocabulary",
    from_objects=False,
)
