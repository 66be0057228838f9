"""Feature rows read in order a block at a time: what stands in for a
dataset's (n × width) float32 array where the rows are never all in memory (a million × 256
float32 is 1 GB): a Parquet file's batches (app/core/formats/parquet_files.py) or the synthetic
mixture's generation blocks (app/core/formats/synthetic_mixture.py). Registration reads its rows in
order: a slice of consecutive rows, a row, or a boolean mask of the rows kept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np


class Blocks(Protocol):
    """A source's blocks in order, each (first row, rows × width float32)."""

    def __iter__(self) -> Iterator[tuple[int, np.ndarray]]: ...

    def close(self) -> None: ...


class RowStream:
    """Rows `rows` (positions in the source, increasing) of a source read block by block.
    A subclass opens the source's blocks from its start (`_open`) and makes the same stream
    over other positions (`_with_rows`)."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, total: int, width: int, rows: np.ndarray | None = None) -> None:
        self.total, self.width = total, width
        self.rows = np.arange(total) if rows is None else rows  # positions in the source
        self._blocks: Blocks | None = None
        self._iterator: Iterator[tuple[int, np.ndarray]] | None = None
        self._block: np.ndarray | None = None
        self._low, self._high = 0, 0  # the source rows of the block in hand

    def _open(self) -> Blocks:
        raise NotImplementedError

    def _with_rows(self, rows: np.ndarray) -> RowStream:
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self.rows), self.width)

    def __len__(self) -> int:
        return len(self.rows)

    def astype(self, dtype: object, copy: bool = False) -> RowStream:
        """float32 already (what `finish` asks of an array)."""
        return self

    def __getitem__(self, key: object) -> np.ndarray | RowStream:
        if isinstance(key, np.ndarray) and key.dtype == bool:
            return self._with_rows(self.rows[key])
        if isinstance(key, slice):  # rows in order: (rows × width), a view where one block
            return self._rows(self.rows[key])  # holds them all
        if isinstance(key, int | np.integer):
            at = int(self.rows[key])
            if not self._low <= at < self._high:  # rows come in order: the next block
                self._seek(at)
            assert self._block is not None
            return self._block[at - self._low]
        raise TypeError(f"{type(self).__name__} takes a row number or a boolean mask, not {key!r}")

    def release(self) -> None:
        """Let go of the block in hand and the source: the rows are all read."""
        self._block = None
        self._low, self._high = 0, 0
        self._close()

    def _close(self) -> None:
        if self._blocks is not None:
            self._blocks.close()
        self._blocks, self._iterator = None, None

    def _rows(self, wanted: np.ndarray) -> np.ndarray:
        """The rows at these source positions (increasing), a run of consecutive ones at a
        time from the block that holds it."""
        parts, i = [], 0
        while i < len(wanted):
            at = int(wanted[i])
            if not self._low <= at < self._high:
                self._seek(at)
            assert self._block is not None
            # the run of consecutive positions from i that this block holds
            ahead = wanted[i : min(len(wanted), i + self._high - at)]
            gaps = ahead - at - np.arange(len(ahead))  # 0 while consecutive, then grows
            run = int(np.searchsorted(gaps, 0, side="right"))
            parts.append(self._block[at - self._low : at - self._low + run])
            i += run
        if len(parts) == 1:
            return parts[0]
        return np.concatenate(parts) if parts else np.empty((0, self.width), np.float32)

    def _seek(self, at: int) -> None:
        """Take the block that holds source row `at` (reading on from the block in hand, or
        from the start for an earlier row)."""
        self._block = None  # the previous block's rows go before the next is taken
        if self._iterator is None or at < self._low:
            self._close()
            self._blocks = self._open()
            self._iterator = iter(self._blocks)
        for start, block in self._iterator:
            if start + len(block) > at:
                self._block = block
                self._low, self._high = start, start + len(block)
                return
        raise IndexError(f"row {at} is past the source's {self.total} rows")


def release_rows(X: object) -> None:
    """`RowStream.release` for features read from a source (an array holds nothing to let
    go)."""
    if isinstance(X, RowStream):
        X.release()
