"""The builtin synthetic dataset: scikit-learn's `make_classification` for a seed, bit for
bit, generated a block of rows at a time.

scikit-learn makes the mixture (the same call with no noise columns and no flips: the same
draws in the same order), and a recording generator keeps what is needed to draw it again a
block at a time: the state before the informative draw (which it answers with zeros, so
scikit-learn's array holds each cluster's centroid and no draws), each cluster's covariance
draw, and the state before the noise columns, drawn next in its stream, which are drawn once
to reach the label flips that follow them and again, a block at a time, as the rows are
written. scikit-learn then shuffles the rows and the features: the features are shuffled
within each block; the rows either land where the shuffle puts them (`load_builtin`: one
float32 array, for the benches and tests that hold it whole) or are registered in the order
they are drawn, each with the id, label, split and subject of the row it becomes
(`streamed`): a registration then holds one block, not the 1 GB array of a million rows ×
256.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.core.formats.row_stream import RowStream
from app.core.schemas import BuiltinDatasetIn

GENERATION_BLOCK = 8_192  # rows per block of the synthetic mixture: bounds its float64 scratch
TEXT = np.dtypes.StringDType()


class _Recorder(np.random.RandomState):
    """A RandomState that records what `make_classification` draws for a mixture without
    holding its informative draw: the state before that draw (a (n × informative) standard
    normal, answered with zeros after advancing past it a block at a time), the uniform
    matrices of the clusters' covariances that follow it, and the state just before its
    first `uniform(size=n)` (the flip draw, which with noise columns comes right after
    them)."""

    def __init__(self, seed: int, n: int, informative: int) -> None:
        super().__init__(seed)
        self.n, self.informative = n, informative
        self.before_informative: dict[str, Any] | None = None
        self.covariances: list[np.ndarray] = []  # each cluster's uniform (informative²) draw
        self.before: dict[str, Any] | None = None

    def standard_normal(self, size=None):
        if self.before_informative is None and size == (self.n, self.informative):
            self.before_informative = self.get_state(legacy=False)
            for start in range(0, self.n, GENERATION_BLOCK):
                super().standard_normal(size=(min(GENERATION_BLOCK, self.n - start), size[1]))
            return np.broadcast_to(np.float64(0.0), size)  # the clusters become their centroids
        return super().standard_normal(size)

    def uniform(self, low=0.0, high=1.0, size=None):
        if self.before is None and size == self.n:
            self.before = self.get_state(legacy=False)
        drawn = super().uniform(low, high, size)
        square = (self.informative, self.informative)
        if self.before_informative is not None and self.before is None and size == square:
            self.covariances.append(drawn)
        return drawn


@dataclass(frozen=True)
class Cluster:
    """One of `make_classification`'s clusters: its rows [start, stop) in drawn order are
    standard normal draws times `covariance` plus `centroid`."""

    start: int
    stop: int
    covariance: np.ndarray  # (informative × informative) float64: 2 × uniform − 1
    centroid: np.ndarray  # (informative,) float64


@dataclass(frozen=True)
class Mixture:
    """A mixture's draws as generator states and its clusters: enough to draw its rows block by
    block, the informative columns too (no array of n rows but the labels and the shuffle)."""

    clusters: list[Cluster]
    y: np.ndarray  # labels in drawn order, flips applied
    order: np.ndarray  # scikit-learn's row shuffle: its row i is drawn row order[i]
    features: np.ndarray  # its feature shuffle: its column c is drawn column features[c]
    before_informative: dict[str, Any]  # the generator's state before the informative draw
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

    def _informative(self, draws: np.ndarray, start: int) -> np.ndarray:
        """Rows [start, start + len(draws)) of the informative columns in float64, each row
        computed as `make_classification` computes it: its draws times its cluster's
        covariance, plus its centroid, plus the shift 0.0, times the scale 1.0."""
        out = np.empty_like(draws)
        stop = start + len(draws)
        for c in self.clusters:
            low, high = max(start, c.start), min(stop, c.stop)
            if low < high:
                rows = slice(low - start, high - start)
                out[rows] = np.dot(draws[rows], c.covariance)
                out[rows] += c.centroid
        out += 0.0
        out *= 1.0
        return out

    def blocks(self) -> Generator[tuple[int, np.ndarray]]:
        """The rows in drawn order, GENERATION_BLOCK at a time: (first row, rows × width
        float32), features in scikit-learn's order. A float32 value is the cast scikit-learn's
        float64 would get, so each entry is the same float32. BLAS runs on one thread while
        they are drawn: a block's product is small, and OpenBLAS's second thread, spinning
        between calls, took the core a registration's sealing threads need."""
        from threadpoolctl import threadpool_limits

        informative = np.random.RandomState()
        informative.set_state(self.before_informative)
        noise = np.random.RandomState()
        noise.set_state(self.before_noise)
        columns = self.clusters[0].covariance.shape[0]
        with threadpool_limits(limits=1, user_api="blas"):
            for start in range(0, self.n, GENERATION_BLOCK):
                stop = min(self.n, start + GENERATION_BLOCK)
                block = np.empty((stop - start, self.width), dtype=np.float32)
                draws = informative.standard_normal(size=(stop - start, columns))
                block[:, :columns] = self._informative(draws, start)
                noise_columns = (stop - start, self.width - columns)
                block[:, columns:] = noise.standard_normal(size=noise_columns)
                yield start, block[:, self.features]


def mixture(spec: BuiltinDatasetIn) -> Mixture:
    """`make_classification`'s draws for the spec, recorded as it makes them (its informative
    draw answered with zeros, so its array holds each cluster's centroid), the noise columns
    drawn only to reach the label flips and the shuffles that follow them."""
    from sklearn import datasets as skd

    n, p = spec.n_samples, spec.n_features
    informative = max(2, min(p, spec.n_classes * 2))
    generator = _Recorder(spec.seed, n, informative)
    centred, y = skd.make_classification(
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
    before_informative, before_noise = generator.before_informative, generator.before
    assert before_informative is not None and before_noise is not None
    sizes = np.bincount(y, minlength=spec.n_classes)  # cluster k holds label k, in order
    stops = np.cumsum(sizes).tolist()
    clusters = [  # a class with no rows (fewer rows than classes) still drew its matrix
        Cluster(
            stop - size, stop, 2 * u - 1, centred[stop - size].copy() if size else np.zeros(len(u))
        )
        for size, stop, u in zip(sizes.tolist(), stops, generator.covariances, strict=True)
    ]
    del centred
    generator.set_state(before_noise)
    for start in range(0, n, GENERATION_BLOCK):
        generator.standard_normal(size=(min(GENERATION_BLOCK, n - start), p - informative))
    flipped = generator.uniform(size=n) < 0.01  # make_classification's flip_y=0.01
    y[flipped] = generator.randint(spec.n_classes, size=flipped.sum())
    order = np.arange(n)  # sklearn.utils.shuffle's draw, then its feature shuffle
    generator.shuffle(order)
    features = np.arange(p)
    generator.shuffle(features)
    return Mixture(
        clusters, y.astype(np.int64), order, features, before_informative, before_noise, p
    )


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
