"""The builtin synthetic dataset: scikit-learn's `make_classification` for a seed, bit for
bit, generated a block of rows at a time (issues 28 and 55, goal 6).

The informative columns come from scikit-learn itself (the same call with no noise columns
and no flips: the same draws in the same order); the noise columns, drawn next in its
stream, are drawn once to reach the label flips that follow them and again, a block at a
time, as the rows are written. scikit-learn then shuffles the rows and the features: the
features are shuffled within each block; the rows either land where the shuffle puts them
(`load_builtin`: one float32 array, for the benches and tests that hold it whole) or are
registered in the order they are drawn, each with the id, label, split and subject of the
row it becomes (`streamed`): a registration then holds one block, not the 1 GB array of a
million rows × 256.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.schemas import BuiltinDatasetIn
from app.services.row_stream import RowStream

GENERATION_BLOCK = 8_192  # rows per block of the synthetic mixture: bounds its float64 scratch
TEXT = np.dtypes.StringDType()


class _StateBeforeDraw(np.random.RandomState):
    """A RandomState that keeps its state from just before its first `uniform(size=n)`: in
    `make_classification` with no noise columns that is the flip draw, which with noise
    columns comes right after them."""

    def __init__(self, seed: int, n: int) -> None:
        super().__init__(seed)
        self.n = n
        self.before: dict[str, Any] | None = None

    def uniform(self, low=0.0, high=1.0, size=None):
        if self.before is None and size == self.n:
            self.before = self.get_state(legacy=False)
        return super().uniform(low, high, size)


@dataclass(frozen=True)
class Mixture:
    """A mixture's draws but the noise columns: enough to draw its rows block by block."""

    informative: np.ndarray  # (n, informative) float32, in drawn order
    y: np.ndarray  # labels in drawn order, flips applied
    order: np.ndarray  # scikit-learn's row shuffle: its row i is drawn row order[i]
    features: np.ndarray  # its feature shuffle: its column c is drawn column features[c]
    before_noise: dict[str, Any]  # the generator's state before the noise columns
    width: int

    @property
    def n(self) -> int:
        return len(self.y)

    def destination(self) -> np.ndarray:
        """Where each drawn row lands in scikit-learn's order (the inverse of `order`)."""
        destination = np.empty(self.n, dtype=np.int64)
        destination[self.order] = np.arange(self.n)
        return destination

    def blocks(self) -> Generator[tuple[int, np.ndarray]]:
        """The rows in drawn order, GENERATION_BLOCK at a time: (first row, rows × width
        float32), features in scikit-learn's order. A float32 informative value is the cast
        scikit-learn's float64 would get, so each entry is the same float32."""
        generator = np.random.RandomState()
        generator.set_state(self.before_noise)
        informative = self.informative.shape[1]
        for start in range(0, self.n, GENERATION_BLOCK):
            stop = min(self.n, start + GENERATION_BLOCK)
            block = np.empty((stop - start, self.width), dtype=np.float32)
            block[:, :informative] = self.informative[start:stop]
            block[:, informative:] = generator.standard_normal(
                size=(stop - start, self.width - informative)
            )
            yield start, block[:, self.features]


def mixture(spec: BuiltinDatasetIn) -> Mixture:
    """`make_classification`'s draws for the spec, the noise columns drawn only to reach the
    label flips and the shuffles that follow them."""
    from sklearn import datasets as skd

    n, p = spec.n_samples, spec.n_features
    informative = max(2, min(p, spec.n_classes * 2))
    generator = _StateBeforeDraw(spec.seed, n)
    Xi, y = skd.make_classification(
        n_samples=n,
        n_features=informative,
        n_informative=informative,
        n_redundant=0,
        n_classes=spec.n_classes,
        n_clusters_per_class=1,
        flip_y=0.0,  # flips nothing; its draw marks where the noise columns start
        shuffle=False,
        random_state=generator,
    )
    Xi = Xi.astype(np.float32)  # half the float64's memory, the same values once cast
    before_noise = generator.before
    assert before_noise is not None
    generator.set_state(before_noise)
    for start in range(0, n, GENERATION_BLOCK):
        generator.standard_normal(size=(min(GENERATION_BLOCK, n - start), p - informative))
    flipped = generator.uniform(size=n) < 0.01  # make_classification's flip_y=0.01
    y[flipped] = generator.randint(spec.n_classes, size=flipped.sum())
    order = np.arange(n)  # sklearn.utils.shuffle's draw, then its feature shuffle
    generator.shuffle(order)
    features = np.arange(p)
    generator.shuffle(features)
    return Mixture(Xi, y.astype(np.int64), order, features, before_noise, p)


def materialized(m: Mixture) -> tuple[np.ndarray, np.ndarray]:
    """(X, y) in scikit-learn's order: X one float32 array."""
    X = np.empty((m.n, m.width), dtype=np.float32)
    destination = m.destination()
    for start, block in m.blocks():
        X[destination[start : start + len(block)]] = block
    return X, m.y[m.order]


class MixtureRows(RowStream):
    """A mixture's rows in drawn order, drawn a block at a time as registration reads them."""

    def __init__(self, m: Mixture, rows: np.ndarray | None = None) -> None:
        super().__init__(m.n, m.width, rows)
        self.mixture = m

    def _open(self) -> Generator[tuple[int, np.ndarray]]:
        return self.mixture.blocks()  # a generator: iterated, and closed when let go

    def _with_rows(self, rows: np.ndarray) -> MixtureRows:
        return MixtureRows(self.mixture, rows)


def subject_names(rows: np.ndarray, size: int | None) -> np.ndarray | None:
    """`subject-<row // size>` for each of scikit-learn's row numbers (compact strings)."""
    if size is None:
        return None
    return np.strings.add("subject-", (rows // size).astype(TEXT))
