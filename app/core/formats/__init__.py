"""The data formats Lethe reads, by name: the API, the CLI and the dashboard read this
registry. A format is a module of this package with a `FORMAT` (app/core/formats/base.py);
adding one is that module and its line below."""

from __future__ import annotations

from app.core.errors import unprocessable
from app.core.formats import csv, npz, parquet, sparse_npz, text_csv
from app.core.formats.base import Format, Options

FORMATS: dict[str, Format] = {
    f.FORMAT.name: f.FORMAT for f in (npz, csv, parquet, text_csv, sparse_npz)
}


def names() -> list[str]:
    return list(FORMATS)


def format_named(name: str) -> Format:
    """The format of that name: 422 `unknown_format`, naming the others, where there is none."""
    try:
        return FORMATS[name]
    except KeyError:
        raise unprocessable(
            "unknown_format", f"format must be one of {', '.join(FORMATS)}, got {name!r}"
        ) from None


def guess(filename: str | None, default: str = "npz") -> str:
    """The format a file's suffix names (an upload's name, an object's key)."""
    lower = (filename or "").lower()
    for f in FORMATS.values():
        if any(lower.endswith(s) for s in f.suffixes):
            return f.name
    return default


def accepted_suffixes() -> list[str]:
    """Every suffix a format answers to: what a file picker offers."""
    return [s for f in FORMATS.values() for s in f.suffixes]


__all__ = ["FORMATS", "Format", "Options", "accepted_suffixes", "format_named", "guess", "names"]
