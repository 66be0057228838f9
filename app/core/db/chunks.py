"""One chunking rule for long `IN (...)` lists: every value is visited, none is dropped."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

CHUNK = 5000  # well under SQLite's 32,766 bound parameters and PostgreSQL's 65,535


def chunked(values: Sequence[T], size: int = CHUNK) -> Iterator[list[T]]:
    """Consecutive slices of at most `size` values covering all of `values`."""
    if size < 1:
        raise ValueError("chunk size must be positive")
    for start in range(0, len(values), size):
        yield list(values[start : start + size])
