"""What a data format is: a name, the file suffixes it answers to, a pydantic model of its
options, and a parse from bytes (or a ranged object) to rows. docs/datasets.md
lists the formats; adding one is a module here and a line in `app/core/formats/__init__.py`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.core.formats.dataset_files import Limits, ParsedDataset

Column = Annotated[str, Field(min_length=1, max_length=200)]


class Options(BaseModel):
    """What every format takes: the seeded split (`seed` None: no split is drawn, as an
    append's rows take their column's or the dataset's rule)."""

    model_config = ConfigDict(extra="ignore", frozen=True, use_attribute_docstrings=True)

    seed: int | None = Field(0, ge=0, le=2**31 - 1)
    """seeds the train/test split"""
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """share of samples put in the test split"""

    def split_given(self, data: bytes) -> bool:
        """Whether the rows carry their own split (a column, or an npz's `split` array)."""
        return False


class ColumnOptions(Options):
    """A table's column mapping (CSV, Parquet, a text corpus)."""

    id_column: Column | None = None
    """the sample id column"""
    subject_column: Column | None = None
    """the data subject column"""
    split_column: Column | None = None
    """a train/test column (default: a seeded stratified split)"""

    def split_given(self, data: bytes) -> bool:
        return self.split_column is not None


class TableOptions(ColumnOptions):
    """A numeric table: a label column and the feature columns."""

    label_column: Column = "label"
    """the label column"""
    feature_columns: list[Column] = Field([], max_length=65_536)
    """the feature columns (default: every other numeric column, or Parquet's one list column)"""

    @field_validator("feature_columns", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """A form sends them as one comma-separated field."""
        if isinstance(value, str):
            return [c.strip() for c in value.split(",") if c.strip()]
        return value


OptionsT = TypeVar("OptionsT", bound=Options)


@dataclass(frozen=True)
class Format(Generic[OptionsT]):
    """One data format: `parse(source, options, limits)` reads its rows (bytes, or, where
    `ranged` is set, a seekable file whose reads are ranged GETs on an object store)."""

    name: str
    suffixes: tuple[str, ...]
    options: type[OptionsT]
    parse: Callable[[Any, OptionsT, Limits], ParsedDataset]
    summary: str
    ranged: bool = False  # reads an object a part at a time (else the object is read whole)
    from_objects: bool = True  # may be read from object storage

    def options_from_form(self, fields: dict[str, str]) -> OptionsT:
        """The options of a multipart form's fields (an empty field is an unset one)."""
        return self.options.model_validate({k: v for k, v in fields.items() if v != ""})
