"""The data formats' registry (app/core/formats): every format module is registered, named by
its suffixes, and its options are checked by their pydantic model."""

from __future__ import annotations

import importlib
import io
import pkgutil

import numpy as np
import pytest
from pydantic import ValidationError

from app.core import formats
from app.core.errors import APIError
from app.core.formats import base
from app.core.formats.dataset_files import Limits

LIMITS = Limits(max_samples=1000, max_features=100, max_cells=100_000, max_npz_bytes=1 << 20)


def test_every_format_module_is_registered_under_its_own_name() -> None:
    """A module of the package that defines a FORMAT is in the registry: adding a format is
    its module and one line."""
    found = {}
    for info in pkgutil.iter_modules(formats.__path__):
        module = importlib.import_module(f"app.core.formats.{info.name}")
        if isinstance(getattr(module, "FORMAT", None), base.Format):
            found[module.FORMAT.name] = module.FORMAT
    assert found == formats.FORMATS
    assert set(formats.names()) == {"npz", "csv", "parquet", "text_csv", "sparse_npz"}
    for f in formats.FORMATS.values():
        assert issubclass(f.options, base.Options)


@pytest.mark.parametrize(
    ("filename", "expected"),
    [("rows.CSV", "csv"), ("a.parquet", "parquet"), ("a.pq", "parquet"), ("a.npz", "npz"),
     ("no-suffix", "npz"), (None, "npz")],
)  # fmt: skip
def test_a_file_s_suffix_names_its_format(filename: str | None, expected: str) -> None:
    assert formats.guess(filename) == expected


def test_an_unknown_format_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(APIError) as caught:
        formats.format_named("xml")
    assert caught.value.status == 422 and caught.value.code == "unknown_format"
    assert "parquet" in caught.value.message


def test_a_form_s_fields_become_the_format_s_checked_options() -> None:
    csv = formats.format_named("csv")
    options = csv.options_from_form(
        {"seed": "7", "test_fraction": "0.25", "feature_columns": "a, b,,c", "id_column": ""}
    )
    assert options.seed == 7 and options.test_fraction == 0.25
    assert options.feature_columns == ["a", "b", "c"]
    assert options.id_column is None  # an empty field is an unset one
    assert options.split_given(b"") is False
    with pytest.raises(ValidationError):
        csv.options_from_form({"seed": "seven"})
    with pytest.raises(ValidationError):
        csv.options_from_form({"test_fraction": "1.5"})
    text = formats.format_named("text_csv").options_from_form({"min_count": "3"})
    assert text.min_count == 3 and text.text_column == "text"


def test_an_npz_tells_whether_it_carries_its_split() -> None:
    with_split, without = io.BytesIO(), io.BytesIO()
    X, y = np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1])
    np.savez(with_split, X=X, y=y, split=np.array(["train"] * 4))
    np.savez(without, X=X, y=y)
    options = formats.format_named("npz").options()
    assert options.split_given(with_split.getvalue())
    assert not options.split_given(without.getvalue())
    assert not options.split_given(b"not a zip")


def test_each_format_parses_its_rows_through_the_registry() -> None:
    csv = formats.format_named("csv")
    body = b"label,x1,x2\n0,1.0,2.0\n1,3.0,4.0\n0,5.0,6.0\n1,7.0,8.0\n"
    parsed = csv.parse(body, csv.options_from_form({}), LIMITS)
    assert len(parsed.y) == 4
    npz = formats.format_named("npz")
    buffer = io.BytesIO()
    np.savez(buffer, X=np.ones((5, 3), np.float32), y=np.array([0, 1, 0, 1, 0]))
    assert len(npz.parse(buffer.getvalue(), npz.options(), LIMITS).y) == 5
