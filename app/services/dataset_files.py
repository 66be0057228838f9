"""Parsing datasets into validated arrays: builtins, .npz (no pickle) and CSV."""

from __future__ import annotations

import csv
import io
import math
import zipfile
from dataclasses import dataclass

import numpy as np

from app.errors import unprocessable
from app.schemas import BuiltinDatasetIn


@dataclass
class ParsedDataset:
    X: np.ndarray  # float32, shape (n, *feature_shape)
    y: np.ndarray  # int64, shape (n,)
    ids: list[str]
    subjects: list[str | None]
    split: list[str]
    n_classes: int
    kind: str


def seeded_split(y: np.ndarray, test_fraction: float, seed: int) -> list[str]:
    """A seeded train/test split, stratified when the classes allow it, else plain random.

    Tiny datasets keep at least one training sample (a single sample is all train).
    """
    from sklearn.model_selection import train_test_split

    n = len(y)
    n_test = min(max(math.ceil(n * test_fraction), 1), n - 1)
    if n_test <= 0:
        return ["train"] * n
    try:  # stratified when every class can appear on both sides
        _, test = train_test_split(np.arange(n), test_size=n_test, random_state=seed, stratify=y)
    except ValueError:
        _, test = train_test_split(np.arange(n), test_size=n_test, random_state=seed)
    split = np.array(["train"] * n, dtype=object)
    split[test] = "test"
    return split.tolist()


def load_builtin(spec: BuiltinDatasetIn) -> ParsedDataset:
    """scikit-learn's bundled datasets (no download) or a seeded Gaussian mixture."""
    from sklearn import datasets as skd

    if spec.builtin == "digits":
        bunch = skd.load_digits()
        X, y, kind = bunch.images / 16.0, bunch.target, "image"
    elif spec.builtin == "breast_cancer":
        bunch = skd.load_breast_cancer()
        X = (bunch.data - bunch.data.mean(0)) / bunch.data.std(0)
        y, kind = bunch.target, "tabular"
    else:
        X, y = skd.make_classification(
            n_samples=spec.n_samples,
            n_features=spec.n_features,
            n_informative=max(2, min(spec.n_features, spec.n_classes * 2)),
            n_redundant=0,
            n_classes=spec.n_classes,
            n_clusters_per_class=1,
            random_state=spec.seed,
        )
        kind = "tabular"
    y = y.astype(np.int64)
    return ParsedDataset(
        X=X.astype(np.float32),
        y=y,
        ids=[str(i) for i in range(len(y))],
        subjects=[None] * len(y),
        split=seeded_split(y, spec.test_fraction, spec.seed),
        n_classes=int(y.max()) + 1,
        kind=kind,
    )


def parse_npz(data: bytes, seed: int, test_fraction: float) -> ParsedDataset:
    """Arrays X, y and optional ids, subjects, split from an .npz, loaded without pickle."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        raise unprocessable("malformed_npz", f"not a readable .npz without pickle: {exc}") from exc
    missing = {"X", "y"} - arrays.keys()
    if missing:
        raise unprocessable("malformed_npz", f"missing arrays: {sorted(missing)}")
    X = _numeric(arrays["X"], "X")
    if X.ndim < 2:
        raise unprocessable("bad_shape", f"X must be (n, features...), got shape {X.shape}")
    n = X.shape[0]
    y = _labels(arrays["y"], n)
    ids = _strings(arrays.get("ids"), n, "ids") or [str(i) for i in range(n)]
    named = _strings(arrays.get("subjects"), n, "subjects")
    subjects: list[str | None] = list(named) if named is not None else [None] * n
    split = _split(arrays.get("split"), y, seed, test_fraction)
    return _finish(X, y, ids, subjects, split, "image" if X.ndim > 2 else "tabular")


def parse_csv(
    data: bytes,
    label_column: str,
    id_column: str | None,
    subject_column: str | None,
    split_column: str | None,
    seed: int,
    test_fraction: float,
) -> ParsedDataset:
    """A CSV with a header; every column other than label/id/subject/split is a feature."""
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8-sig"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise unprocessable("malformed_csv", f"not a UTF-8 CSV: {exc}") from exc
    if len(rows) < 2:
        raise unprocessable("malformed_csv", "a CSV needs a header row and at least one row")
    header = [h.strip() for h in rows[0]]
    if label_column not in header:
        raise unprocessable(
            "malformed_csv", f"label column {label_column!r} not in header", {"header": header}
        )
    special = {c for c in (label_column, id_column, subject_column, split_column) if c}
    feature_cols = [i for i, h in enumerate(header) if h not in special]
    if not feature_cols:
        raise unprocessable("malformed_csv", "no feature columns")
    body = rows[1:]
    bad = [i + 2 for i, r in enumerate(body) if len(r) != len(header)]
    if bad:
        raise unprocessable(
            "malformed_csv", "rows with the wrong number of fields", {"lines": bad[:20]}
        )

    def column(name: str | None) -> list[str] | None:
        if not name:
            return None
        if name not in header:
            raise unprocessable("malformed_csv", f"column {name!r} not in header")
        j = header.index(name)
        return [r[j].strip() for r in body]

    try:
        X = np.array([[float(r[i]) for i in feature_cols] for r in body], dtype=np.float64)
        y_raw = np.array([float(v) for v in column(label_column) or []])
    except ValueError as exc:
        raise unprocessable("malformed_csv", f"non-numeric value: {exc}") from exc
    n = len(body)
    y = _labels(y_raw, n)
    ids = column(id_column) or [str(i) for i in range(n)]
    subjects: list[str | None] = [s or None for s in column(subject_column) or []] or [None] * n
    split_values = column(split_column)
    split = _split(np.array(split_values) if split_values else None, y, seed, test_fraction)
    return _finish(_numeric(X, "features"), y, ids, subjects, split, "tabular")


def _numeric(arr: np.ndarray, name: str) -> np.ndarray:
    if arr.dtype.kind not in "biuf":
        raise unprocessable("bad_dtype", f"{name} must be numeric, got dtype {arr.dtype}")
    out = arr.astype(np.float64)
    if not np.isfinite(out).all():
        raise unprocessable(
            "non_finite",
            f"{name} contains NaN or infinite values",
            {"count": int((~np.isfinite(out)).sum())},
        )
    return out


def _labels(arr: np.ndarray, n: int) -> np.ndarray:
    y = _numeric(np.asarray(arr), "y")
    if y.shape != (n,):
        raise unprocessable("bad_shape", f"y must have shape ({n},), got {y.shape}")
    if not np.all(y == np.round(y)):
        raise unprocessable("bad_labels", "labels must be integers")
    if y.min() < 0:
        raise unprocessable(
            "labels_out_of_range", "labels must be in [0, n_classes)", {"min": int(y.min())}
        )
    if y.max() >= 10_000:
        raise unprocessable("labels_out_of_range", "at most 10,000 classes", {"max": int(y.max())})
    return y.astype(np.int64)


def _strings(arr: np.ndarray | None, n: int, name: str) -> list[str] | None:
    if arr is None:
        return None
    if arr.shape != (n,):
        raise unprocessable("bad_shape", f"{name} must have shape ({n},), got {arr.shape}")
    if arr.dtype.kind not in "iuUS":
        raise unprocessable("bad_dtype", f"{name} must be integers or strings")
    values = [v.decode() if isinstance(v, bytes) else str(v) for v in arr.tolist()]
    if any(not v or len(v) > 200 for v in values):
        raise unprocessable("bad_ids", f"{name} must be non-empty strings of at most 200 chars")
    return values


def _split(arr: np.ndarray | None, y: np.ndarray, seed: int, test_fraction: float) -> list[str]:
    if arr is None:
        return seeded_split(y, test_fraction, seed)
    values = [v.decode() if isinstance(v, bytes) else str(v) for v in np.asarray(arr).tolist()]
    if len(values) != len(y):
        raise unprocessable("bad_shape", f"split must have shape ({len(y)},)")
    unknown = sorted(set(values) - {"train", "test"})
    if unknown:
        raise unprocessable(
            "bad_split", "split values must be 'train' or 'test'", {"unknown": unknown[:20]}
        )
    if "train" not in values:
        raise unprocessable("bad_split", "no training samples")
    return values


def _finish(
    X: np.ndarray,
    y: np.ndarray,
    ids: list[str],
    subjects: list[str | None],
    split: list[str],
    kind: str,
) -> ParsedDataset:
    if len(y) == 0:
        raise unprocessable("empty_dataset", "the dataset has no samples")
    seen: set[str] = set()
    repeated: set[str] = set()
    for i in ids:
        (repeated if i in seen else seen).add(i)
    dupes = sorted(repeated)
    if dupes:
        raise unprocessable(
            "duplicate_ids",
            "external ids must be unique",
            {"duplicates": dupes[:50], "count": len(dupes)},
        )
    return ParsedDataset(
        X=X.astype(np.float32),
        y=y,
        ids=ids,
        subjects=subjects,
        split=split,
        n_classes=int(y.max()) + 1,
        kind=kind,
    )
