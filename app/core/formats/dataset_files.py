"""Parsing datasets into validated arrays: builtins, .npz (no pickle) and CSV."""

from __future__ import annotations

import csv
import io
import math
import zipfile
import zlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, TypeVar, overload

import numpy as np
from numpy.lib import format as npy_format

from app.core import identity, text
from app.core.errors import APIError, unprocessable
from app.core.formats import synthetic_mixture
from app.core.schemas import BuiltinDatasetIn

if TYPE_CHECKING:
    from app.core.settings import Settings


T = TypeVar("T", str, str | None)


@dataclass
class ParsedDataset:
    X: np.ndarray  # float32, shape (n, *feature_shape)
    y: np.ndarray  # int64, shape (n,)
    ids: Sequence[str]  # a list, or `Texts` (Parquet: compact)
    subjects: Sequence[str | None]
    split: list[str]
    n_classes: int
    kind: str
    text: dict[str, object] | None = None  # a corpus: its vocabulary and counts (app/core/text.py)
    numbered: bool = False  # ids are row numbers of a builtin, which name nobody
    # rows whose id or subject Lethe wrote otherwise before canonical ids (app/core/identity.py):
    # position -> that writing, whose token a suppression made then holds
    written_ids: dict[int, str] = field(default_factory=dict)
    written_subjects: dict[int, str] = field(default_factory=dict)


class Texts(Sequence[str]):
    """Strings held in one numpy StringDType array: a short id (up to 15 bytes) takes 16 bytes
    where a list held a 56-byte object and its pointer (a million Parquet ids were 64 MB of a
    registration's memory)."""

    DTYPE = np.dtypes.StringDType()

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    @classmethod
    def joined(cls, parts: list[np.ndarray]) -> Texts:
        return cls(np.concatenate(parts) if parts else np.empty(0, dtype=cls.DTYPE))

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Texts: ...

    def __getitem__(self, index: int | slice) -> str | Texts:
        if isinstance(index, slice):
            return Texts(self.values[index])
        return str(self.values[index])

    def __iter__(self) -> Iterator[str]:
        return (str(v) for v in self.values)

    def repeated(self) -> list[str]:
        """The values that occur more than once, sorted (a sort of the array, no set)."""
        unique, counts = np.unique(self.values, return_counts=True)
        return [str(v) for v in unique[counts > 1]]


class MaybeTexts(Sequence[str | None]):
    """Texts where a value may be missing (a subject column's empty cells), in one numpy
    StringDType array with None for missing: a million subjects held as a list were 65 MB
    of a registration's memory, past its bound."""

    DTYPE = np.dtypes.StringDType(na_object=None)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    @classmethod
    def joined(cls, parts: list[np.ndarray]) -> MaybeTexts:
        return cls(np.concatenate(parts) if parts else np.empty(0, dtype=cls.DTYPE))

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, index: int) -> str | None: ...

    @overload
    def __getitem__(self, index: slice) -> MaybeTexts: ...

    def __getitem__(self, index: int | slice) -> str | None | MaybeTexts:
        if isinstance(index, slice):
            return MaybeTexts(self.values[index])
        value = self.values[index]
        return None if value is None else str(value)

    def __iter__(self) -> Iterator[str | None]:
        return iter(self.values.tolist())


def texts_at(values: Sequence[T], positions: Sequence[int]) -> list[T]:
    """The values (strings, or None) at `positions`: a run of rows sliced at once (`Texts`
    decoded together, not one at a time)."""
    if isinstance(positions, range) and positions.step == 1:
        part = values[positions.start : positions.stop]
        return part.values.tolist() if isinstance(part, Texts | MaybeTexts) else list(part)
    return [values[i] for i in positions]


DERIVED = "by default what this machine's memory holds"


@dataclass(frozen=True)
class Limits:
    """How large a dataset may be parsed; checked before the arrays are built."""

    max_samples: int = 2_000_000
    max_features: int = 65_536  # per sample: the product of X.shape[1:]
    max_cells: int = 100_000_000  # samples x features
    max_npz_bytes: int = 1024**3  # uncompressed bytes read from an .npz

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            max_samples=settings.dataset_sample_limit,
            max_features=settings.max_features_per_sample,
            max_cells=settings.dataset_cell_limit,
            max_npz_bytes=settings.max_npz_bytes,
        )


def check_size(n: int, features: int, limits: Limits) -> None:
    """413 when n samples of `features` features exceed the limits."""
    if n > limits.max_samples:
        raise APIError(
            413,
            "too_many_samples",
            f"{n} samples; at most {limits.max_samples} (LETHE_MAX_DATASET_SAMPLES; {DERIVED})",
            {"n": n, "max_samples": limits.max_samples, "setting": "LETHE_MAX_DATASET_SAMPLES"},
        )
    if features > limits.max_features:
        raise APIError(
            413,
            "too_many_features",
            f"{features} features per sample; at most {limits.max_features} "
            "(LETHE_MAX_FEATURES_PER_SAMPLE)",
            {"features": features, "setting": "LETHE_MAX_FEATURES_PER_SAMPLE"},
        )
    if n * features > limits.max_cells:
        raise APIError(
            413,
            "dataset_too_large",
            f"{n} samples x {features} features = {n * features} values; "
            f"at most {limits.max_cells} (LETHE_MAX_DATASET_CELLS; {DERIVED})",
            {
                "n": n,
                "features": features,
                "max_cells": limits.max_cells,
                "setting": "LETHE_MAX_DATASET_CELLS",
            },
        )


def check_builtin(spec: BuiltinDatasetIn, limits: Limits) -> None:
    """422 for a synthetic spec that asks for more than the limits allow (before building)."""
    if spec.builtin == "synthetic_corpus":
        check_size(spec.n_samples, spec.vocabulary, limits)
        return
    if spec.builtin != "synthetic":
        return
    cells = spec.n_samples * spec.n_features
    if (
        spec.n_samples > limits.max_samples
        or spec.n_features > limits.max_features
        or cells > limits.max_cells
    ):
        raise unprocessable(
            "invalid_request",
            f"synthetic dataset of {spec.n_samples} x {spec.n_features} = {cells} values "
            f"exceeds the limits ({limits.max_samples} samples, {limits.max_features} "
            f"features, {limits.max_cells} values: LETHE_MAX_DATASET_SAMPLES, "
            f"LETHE_MAX_FEATURES_PER_SAMPLE, LETHE_MAX_DATASET_CELLS; {DERIVED})",
            {
                "n_samples": spec.n_samples,
                "n_features": spec.n_features,
                "max_samples": limits.max_samples,
                "max_features": limits.max_features,
                "max_cells": limits.max_cells,
            },
        )


def seeded_split(y: np.ndarray, test_fraction: float, seed: int | None) -> list[str]:
    """A seeded train/test split, stratified when the classes allow it, else plain random.

    Tiny datasets keep at least one training sample (a single sample is all train). With no
    seed, every row `train` and no split made: the caller gives each row its split (an
    append's rule, a keyed hash of its id); the split it would replace was wasted work
    in an append's child.
    """
    if seed is None:
        return ["train"] * len(y)
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


def builtin_rows(spec: BuiltinDatasetIn) -> int:
    """The rows a synthetic builtin will have, known from its spec (0: the others, known once
    loaded)."""
    return spec.n_samples if spec.builtin in ("synthetic", "synthetic_corpus") else 0


def streamed_builtin(spec: BuiltinDatasetIn) -> ParsedDataset:
    """A builtin as registration reads it: the synthetic mixture's rows in the order they are
    drawn, a block at a time (app/core/formats/synthetic_mixture.py), each with the id (its row
    number in scikit-learn's order), label, split and subject `load_builtin` gives that row;
    the other builtins as `load_builtin` gives them."""
    if spec.builtin != "synthetic":
        return load_builtin(spec)
    m = synthetic_mixture.mixture(spec)
    destination = m.destination()  # each drawn row's number in scikit-learn's order
    theirs = seeded_split(m.y[m.order], spec.test_fraction, spec.seed)  # scikit-learn's order
    split = [theirs[i] for i in destination.tolist()]  # the two strings shared, none per row
    subjects = synthetic_mixture.subject_names(destination, spec.subject_size)
    return ParsedDataset(
        X=synthetic_mixture.MixtureRows(m),  # type: ignore[arg-type]
        y=m.y,
        ids=Texts(destination.astype(Texts.DTYPE)),
        subjects=[None] * m.n
        if subjects is None
        else MaybeTexts(subjects.astype(MaybeTexts.DTYPE)),
        split=split,
        n_classes=int(m.y.max()) + 1,
        kind="tabular",
        numbered=True,
    )


def load_builtin(spec: BuiltinDatasetIn) -> ParsedDataset:
    """scikit-learn's bundled datasets (no download) or a seeded Gaussian mixture, whole."""
    from sklearn import datasets as skd

    if spec.builtin == "synthetic_corpus":
        return _synthetic_corpus(spec)
    if spec.builtin == "digits":
        bunch = skd.load_digits()
        X, y, kind = bunch.images / 16.0, bunch.target, "image"
    elif spec.builtin == "breast_cancer":
        bunch = skd.load_breast_cancer()
        X = (bunch.data - bunch.data.mean(0)) / bunch.data.std(0)
        y, kind = bunch.target, "tabular"
    else:
        X, y = synthetic_mixture.materialized(synthetic_mixture.mixture(spec))
        kind = "tabular"
    y = y.astype(np.int64)
    return ParsedDataset(
        X=X.astype(np.float32, copy=False),
        y=y,
        ids=[str(i) for i in range(len(y))],
        subjects=_subjects(len(y), spec.subject_size if spec.builtin == "synthetic" else None),
        split=seeded_split(y, spec.test_fraction, spec.seed),
        n_classes=int(y.max()) + 1,
        kind=kind,
    )


def _subjects(n: int, size: int | None) -> list[str | None]:
    """Consecutive rows grouped into subjects of `size` (a synthetic dataset's option)."""
    if size is None:
        return [None] * n
    return [f"subject-{i // size}" for i in range(n)]


NPZ_ARRAYS = ("X", "y", "ids", "subjects", "split")
NPY_MAX_HEADER = 10_000


def parse_npz(
    data: bytes, seed: int | None, test_fraction: float, limits: Limits | None = None
) -> ParsedDataset:
    """Arrays X, y and optional ids, subjects, split from an .npz, loaded without pickle.

    Nothing is decompressed before the zip's sizes and every .npy header (shape, dtype)
    passed the limits: a small compressed file cannot claim gigabytes of memory."""
    try:
        arrays = _read_npz(data, limits or Limits())
    except (
        ValueError,
        OSError,
        zipfile.BadZipFile,
        EOFError,
        RuntimeError,
        NotImplementedError,
        zlib.error,
    ) as exc:
        raise unprocessable("malformed_npz", f"not a readable .npz without pickle: {exc}") from exc
    X = _numeric(arrays["X"], "X")
    if X.ndim < 2:
        raise unprocessable("bad_shape", f"X must be (n, features...), got shape {X.shape}")
    n = X.shape[0]
    y = label_array(arrays["y"], n)
    given = _strings(arrays.get("ids"), n, "ids")
    ids, written_ids = canonical_ids(given if given is not None else range(n), "ids")
    named = _strings(arrays.get("subjects"), n, "subjects")
    subjects, written_subjects = (
        canonical_subjects(named, "subjects") if named is not None else ([None] * n, {})
    )
    split = split_of(arrays.get("split"), y, seed, test_fraction)
    parsed = finish(X, y, ids, subjects, split, "image" if X.ndim > 2 else "tabular")
    return replace(parsed, written_ids=written_ids, written_subjects=written_subjects)


def _members(
    zf: zipfile.ZipFile,
    wanted: Collection[str],
    required: Collection[str],
    missing_what: str,
    limits: Limits,
) -> dict[str, zipfile.ZipInfo]:
    """The .npz's arrays named in `wanted`, each once, the `required` ones present and their
    stored bytes within the limit (checked before anything is read)."""
    members: dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        name = info.filename.removesuffix(".npy")
        if name in wanted:
            if name in members:
                raise unprocessable("malformed_npz", f"array {name!r} appears twice")
            members[name] = info
    missing = set(required) - members.keys()
    if missing:
        raise unprocessable("malformed_npz", f"{missing_what}{sorted(missing)}")
    stored = sum(info.file_size for info in members.values())
    if stored > limits.max_npz_bytes:
        raise _npz_too_large(stored, limits)
    return members


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """One array, without pickle."""
    with zf.open(info) as fp:
        return npy_format.read_array(fp, allow_pickle=False, max_header_size=NPY_MAX_HEADER)


def _read_npz(data: bytes, limits: Limits) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        members = _members(zf, NPZ_ARRAYS, ("X", "y"), "missing arrays: ", limits)
        headers = {name: _npy_header(zf, name, info) for name, info in members.items()}

        shape, dtype = headers["X"]
        if dtype.kind not in "biuf" or dtype.itemsize > 8:
            raise unprocessable("bad_dtype", f"X must be numeric, got dtype {dtype}")
        if len(shape) < 2:
            raise unprocessable("bad_shape", f"X must be (n, features...), got shape {shape}")
        n = shape[0]
        check_size(n, math.prod(shape[1:]), limits)
        for name, (shape, _) in headers.items():
            if name != "X" and math.prod(shape) > n:
                raise unprocessable(
                    "bad_shape", f"{name} must have shape ({n},), got {tuple(shape)}"
                )
        declared = sum(math.prod(shape) * dtype.itemsize for shape, dtype in headers.values())
        if declared > limits.max_npz_bytes:
            raise _npz_too_large(declared, limits)

        return {name: _read_member(zf, info) for name, info in members.items()}


def _npy_header(
    zf: zipfile.ZipFile, name: str, info: zipfile.ZipInfo
) -> tuple[tuple[int, ...], np.dtype]:
    """A member's shape and dtype, read from its .npy header alone."""
    with zf.open(info) as fp:
        version = npy_format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = npy_format.read_array_header_1_0(fp, NPY_MAX_HEADER)
        elif version == (2, 0):
            shape, _, dtype = npy_format.read_array_header_2_0(fp, NPY_MAX_HEADER)
        else:
            raise unprocessable("malformed_npz", f"{name}: unsupported .npy version {version}")
    if dtype.hasobject:
        raise unprocessable(
            "malformed_npz", f"{name} has an object dtype: it needs pickle, which is refused"
        )
    return tuple(shape), dtype


def _npz_too_large(size: int, limits: Limits) -> APIError:
    return APIError(
        413,
        "dataset_too_large",
        f"the .npz arrays hold {size} bytes uncompressed; at most {limits.max_npz_bytes}",
        {"bytes": size, "max_npz_bytes": limits.max_npz_bytes},
    )


def parse_csv(
    data: bytes,
    label_column: str,
    id_column: str | None,
    subject_column: str | None,
    split_column: str | None,
    seed: int | None,
    test_fraction: float,
    limits: Limits | None = None,
    feature_columns: list[str] | None = None,
) -> ParsedDataset:
    """A CSV with a header; the features are `feature_columns`, or every column other than
    label/id/subject/split."""
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8-sig"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise unprocessable("malformed_csv", f"not a UTF-8 CSV: {exc}") from exc
    if len(rows) < 2:
        raise unprocessable("malformed_csv", "a CSV needs a header row and at least one row")
    header = _header(rows[0])
    if label_column not in header:
        raise unprocessable(
            "malformed_csv", f"label column {label_column!r} not in header", {"header": header}
        )
    special = {c for c in (label_column, id_column, subject_column, split_column) if c}
    missing = [c for c in [*special, *(feature_columns or [])] if c not in header]
    if missing:
        raise unprocessable(
            "missing_column", f"column {missing[0]!r} not in header", {"header": header}
        )
    if feature_columns:
        named = sorted(special.intersection(feature_columns))
        if named:
            raise unprocessable(
                "invalid_request",
                f"column {named[0]!r} is the label, id, subject or split column: it cannot "
                "also be a feature",
                {"column": named[0]},
            )
        feature_cols = [header.index(c) for c in feature_columns]
    else:
        feature_cols = [i for i, h in enumerate(header) if h not in special]
    if not feature_cols:
        raise unprocessable("malformed_csv", "no feature columns")
    body = rows[1:]
    check_size(len(body), len(feature_cols), limits or Limits())
    column = _columns(header, body)
    X = np.empty((len(body), len(feature_cols)), dtype=np.float64)
    for k, r in enumerate(body):  # row by row: no list of Python floats for all cells
        X[k] = [_cell(r, i, header, k) for i in feature_cols]
    label_at = header.index(label_column)
    y_raw = np.array([_cell(r, label_at, header, k) for k, r in enumerate(body)])
    n = len(body)
    y = label_array(y_raw, n)
    ids, written_ids = canonical_ids(column(id_column) or [str(i) for i in range(n)], "ids")
    subjects, written_subjects = _subject_column(column(subject_column), n)
    split_values = column(split_column)
    split = split_of(np.array(split_values) if split_values else None, y, seed, test_fraction)
    parsed = finish(X, y, ids, subjects, split, "tabular")
    return replace(parsed, written_ids=written_ids, written_subjects=written_subjects)


def _header(row: list[str]) -> list[str]:
    """A CSV's header, its names trimmed; 422 when a name repeats (which column is meant?)."""
    header = [h.strip() for h in row]
    repeated = sorted({h for h in header if header.count(h) > 1})
    if repeated:
        raise unprocessable(
            "duplicate_columns",
            f"the header names column {repeated[0]!r} more than once",
            {"columns": repeated[:20]},
        )
    return header


def _cell(row: list[str], at: int, header: list[str], k: int) -> float:
    """One numeric cell; 422 naming its column and row (0 is the first row after the header),
    never its value (a misplaced column may hold a person's id)."""
    try:
        value = float(row[at])
    except ValueError:
        value = None
    if value is None or not math.isfinite(value):
        what = "not a number" if value is None else "NaN or infinite"
        raise unprocessable(
            "malformed_csv" if value is None else "non_finite",
            f"column {header[at]!r}, row {k}: {what}",
            {"column": header[at], "row": k, "line": k + 2},
        )
    return value


def _subject_column(values: list[str] | None, n: int) -> tuple[list[str | None], dict[int, str]]:
    if values is None:
        return [None] * n, {}
    return canonical_subjects(values, "subjects")


def _columns(header: list[str], body: list[list[str]]) -> Callable[[str | None], list[str] | None]:
    """A reader of a CSV's named columns (None for an unnamed one), once every row is checked
    to have the header's number of fields."""
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

    return column


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


def label_array(arr: np.ndarray, n: int) -> np.ndarray:
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


def _strings(arr: np.ndarray | None, n: int, name: str) -> list[object] | None:
    """An .npz's id or subject array as values (their canonical text is made by `finish`)."""
    if arr is None:
        return None
    if arr.shape != (n,):
        raise unprocessable("bad_shape", f"{name} must have shape ({n},), got {arr.shape}")
    if arr.dtype.kind not in "iuUS":
        raise unprocessable("bad_dtype", f"{name} must be integers or strings")
    return list(arr.tolist())


def canonical_ids(
    values: Sequence[object], what: str, start: int = 0
) -> tuple[list[str], dict[int, str]]:
    """Ids as their canonical text (app/core/identity.py), and the rows Lethe wrote otherwise
    before (position -> that writing). 422 names the column and row, never the value."""
    out: list[str] = []
    written: dict[int, str] = {}
    for i, value in enumerate(values):
        try:
            text_ = identity.canonical(value)
        except identity.BadId as exc:
            raise unprocessable(
                "bad_ids", f"{what}, row {start + i}: {exc}", {"column": what, "row": start + i}
            ) from None
        before = identity.written(value)
        if before != text_:
            written[start + i] = before
        out.append(text_)
    return out, written


def canonical_subjects(
    values: Sequence[object], what: str, start: int = 0
) -> tuple[list[str | None], dict[int, str]]:
    """`canonical_ids` of a subject column, where a missing or empty cell names nobody (a
    person's many rows read once: each distinct value made canonical once)."""
    distinct = list(dict.fromkeys(v for v in values if v is not None and v != "" and v != b""))
    try:
        texts, _ = canonical_ids(distinct, what)
    except APIError:  # name the row, not the distinct value's place
        for i, value in enumerate(values):
            if value is not None and value != "" and value != b"":
                canonical_ids([value], what, start + i)
        raise
    text_of: dict[object, str | None] = dict(zip(distinct, texts, strict=True))
    changed = {v: w for v, t in text_of.items() if (w := identity.written(v)) != t}
    text_of |= {None: None, "": None, b"": None}
    out = [text_of[v] for v in values]
    if not changed:
        return out, {}
    return out, {start + i: changed[v] for i, v in enumerate(values) if v in changed}


def split_of(
    arr: np.ndarray | None, y: np.ndarray, seed: int | None, test_fraction: float
) -> list[str]:
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


def finish(
    X: np.ndarray,
    y: np.ndarray,
    ids: Sequence[str],
    subjects: Sequence[str | None],
    split: list[str],
    kind: str,
) -> ParsedDataset:
    if len(y) == 0:
        raise unprocessable("empty_dataset", "the dataset has no samples")
    dupes = ids.repeated() if isinstance(ids, Texts) else _repeated(ids)
    if dupes:
        raise unprocessable(
            "duplicate_ids",
            "external ids must be unique",
            {"duplicates": dupes[:50], "count": len(dupes)},
        )
    return ParsedDataset(
        X=X.astype(np.float32, copy=False),
        y=y,
        ids=ids,
        subjects=subjects,
        split=split,
        n_classes=int(y.max()) + 1,
        kind=kind,
    )


def _repeated(ids: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    repeated: set[str] = set()
    for i in ids:
        (repeated if i in seen else seen).add(i)
    return sorted(repeated)


# ---- text corpora (seed 000) -----------------------------------------------------------------


def _synthetic_corpus(spec: BuiltinDatasetIn) -> ParsedDataset:
    """Seed 000's generative model with known A*, R* (regenerated from the same spec)."""
    corpus = text.synthetic_corpus(
        spec.vocabulary,
        spec.topics,
        spec.n_samples,
        spec.document_length,
        spec.separability,
        spec.seed,
    )
    words = [f"w{i}" for i in range(spec.vocabulary)]
    y = corpus.labels  # the dominant topic: a label for a downstream head
    split = seeded_split(y, spec.test_fraction, spec.seed)
    parsed = finish(
        corpus.counts, y, [str(i) for i in range(len(y))], [None] * len(y), split, "text"
    )
    short = int((corpus.counts.sum(1) < 2).sum())
    return _with_text(parsed, text.Corpus(corpus.counts, words, short).meta(1))


def parse_text_csv(
    data: bytes,
    text_column: str,
    label_column: str | None,
    id_column: str | None,
    subject_column: str | None,
    split_column: str | None,
    seed: int | None,
    test_fraction: float,
    min_count: int,
    limits: Limits | None = None,
) -> ParsedDataset:
    """A CSV with a text column (plus optional label, id, subject and split columns): each
    document becomes its word counts over a vocabulary fixed now (app/core/text.py)."""
    try:
        rows = list(csv.reader(io.StringIO(data.decode("utf-8-sig"))))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise unprocessable("malformed_csv", f"not a UTF-8 CSV: {exc}") from exc
    if not rows:
        raise unprocessable("empty_corpus", "the CSV is empty")
    header = [h.strip() for h in rows[0]]
    if text_column not in header:
        raise unprocessable(
            "malformed_csv", f"text column {text_column!r} not in header", {"header": header}
        )
    body = [r for r in rows[1:] if r]
    if not body:
        raise unprocessable("empty_corpus", "the CSV has no documents")
    column = _columns(header, body)
    n = len(body)
    size_limits = limits or Limits()
    corpus = text.count_documents(
        column(text_column) or [],
        min_count,
        lambda docs, words: check_size(docs, words, size_limits),
    )
    labels = column(label_column) if label_column and label_column in header else None
    y = _corpus_labels(labels, n)
    ids, written_ids = canonical_ids(column(id_column) or [str(i) for i in range(n)], "ids")
    subjects, written_subjects = _subject_column(column(subject_column), n)
    split_values = column(split_column)
    split = split_of(np.array(split_values) if split_values else None, y, seed, test_fraction)
    parsed = finish(corpus.counts, y, ids, subjects, split, "text")
    parsed = replace(parsed, written_ids=written_ids, written_subjects=written_subjects)
    return _with_text(parsed, corpus.meta(min_count))


def _corpus_labels(labels: list[str] | None, n: int) -> np.ndarray:
    """A corpus's labels (a topic head's targets), or zeros where it has none."""
    if not labels:
        return np.zeros(n, np.int64)
    try:
        return label_array(np.array([float(v) for v in labels]), n)
    except ValueError as exc:
        raise unprocessable("malformed_csv", f"non-numeric label: {exc}") from exc


SPARSE_MEMBERS = {"data", "indices", "indptr", "shape", "format"}


def parse_sparse_npz(
    data: bytes, seed: int | None, test_fraction: float, limits: Limits | None = None
) -> ParsedDataset:
    """A document-term matrix saved by scipy's `save_npz` (CSR or CSC, read without pickle):
    rows are documents, columns the vocabulary (words named `w0`, `w1`, ...). Every array is
    checked before scipy sees it (`load_npz` does not check index bounds, and
    `toarray()` then wrote out of bounds and killed the server)."""
    limits = limits or Limits()
    matrix = _checked_sparse(_sparse_arrays(data, limits), limits)
    n, vocabulary = matrix.shape
    counts = np.asarray(matrix.toarray(), dtype=np.float64)
    text.check_corpus(counts)
    y = np.zeros(n, dtype=np.int64)
    split = seeded_split(y, test_fraction, seed)
    parsed = finish(counts, y, [str(i) for i in range(n)], [None] * n, split, "text")
    short = int((counts.sum(1) < 2).sum())
    words = [f"w{i}" for i in range(vocabulary)]
    return _with_text(parsed, text.Corpus(counts.astype(np.float32), words, short).meta(1))


def _sparse_arrays(data: bytes, limits: Limits) -> dict[str, np.ndarray]:
    """The five arrays of a `save_npz` file, each read with its header checked first."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            missing = "not a scipy sparse matrix: missing "
            members = _members(zf, SPARSE_MEMBERS, SPARSE_MEMBERS, missing, limits)
            arrays: dict[str, np.ndarray] = {}
            for name, info in members.items():
                shape, dtype = _npy_header(zf, name, info)
                if math.prod(shape) * dtype.itemsize > limits.max_npz_bytes:
                    raise _npz_too_large(math.prod(shape) * dtype.itemsize, limits)
                arrays[name] = _read_member(zf, info)
            return arrays
    except (ValueError, OSError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise unprocessable("malformed_npz", f"not a readable sparse .npz: {exc}") from exc


def _checked_sparse(arrays: dict[str, np.ndarray], limits: Limits) -> Any:
    """A CSR or CSC matrix built from arrays that hold: format, a 2-int shape within the
    limits, real finite data, integer indices inside the minor axis, and an index pointer
    that starts at 0, never decreases and ends at the number of stored values."""
    import scipy.sparse

    def bad(what: str) -> APIError:
        return unprocessable("malformed_sparse", f"not a valid sparse matrix: {what}")

    fmt = arrays["format"]
    if fmt.ndim != 0 or fmt.dtype.kind not in "US":
        raise bad("format must be the string 'csr' or 'csc'")
    kind = fmt.item().decode() if isinstance(fmt.item(), bytes) else str(fmt.item())
    if kind not in ("csr", "csc"):
        raise bad(f"format {kind!r}; only csr and csc are read")
    shape = arrays["shape"]
    if shape.dtype.kind not in "iu" or shape.shape != (2,) or (shape < 1).any():
        raise bad("shape must be two positive integers")
    n, vocabulary = (int(v) for v in shape)
    check_size(n, vocabulary, limits)
    values, indices, indptr = arrays["data"], arrays["indices"], arrays["indptr"]
    if values.ndim != 1 or values.dtype.kind not in "buif":
        raise bad("data must be a 1-D array of real numbers (no complex, no objects)")
    if not np.isfinite(values.astype(np.float64, copy=False)).all():
        raise bad("data holds NaN or infinite values")
    if len(values) > n * vocabulary:
        raise bad(f"{len(values)} stored values in a {n} × {vocabulary} matrix")
    major, minor = (n, vocabulary) if kind == "csr" else (vocabulary, n)
    if indices.ndim != 1 or indices.dtype.kind not in "iu" or len(indices) != len(values):
        raise bad("indices must be a 1-D integer array as long as data")
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= minor):
        raise bad(f"an index is outside [0, {minor})")
    if indptr.ndim != 1 or indptr.dtype.kind not in "iu" or len(indptr) != major + 1:
        raise bad(f"indptr must be a 1-D integer array of {major + 1} entries")
    if int(indptr[0]) != 0 or int(indptr[-1]) != len(indices) or (np.diff(indptr) < 0).any():
        raise bad("indptr must start at 0, never decrease and end at the number of values")
    build = scipy.sparse.csr_matrix if kind == "csr" else scipy.sparse.csc_matrix
    return build((values, indices.astype(np.int64), indptr.astype(np.int64)), shape=(n, vocabulary))


def _with_text(parsed: ParsedDataset, meta: dict[str, object]) -> ParsedDataset:
    parsed.text = meta
    return parsed


def in_form(parsed: ParsedDataset, rules: identity.DatasetIds) -> ParsedDataset:
    """The parsed ids and subjects as the dataset keeps them: numbers written once where it
    says its ids are numbers, case-folded where case does not matter, or, for a dataset
    registered before canonical ids, as Lethe wrote them then. 422 when folding makes two
    ids one, or an id promised a number is not one."""
    if rules.legacy:
        ids = [parsed.written_ids.get(i, x) for i, x in enumerate(parsed.ids)]
        subjects = [
            parsed.written_subjects.get(i, s) if s is not None else None
            for i, s in enumerate(parsed.subjects)
        ]
        return replace(parsed, ids=ids, subjects=subjects)
    fold = rules.case == "insensitive"
    if not fold and not rules.numeric:
        return parsed
    form = rules.form("sample")
    written_ids = dict(parsed.written_ids)
    ids = _refined(form, list(parsed.ids), written_ids, "ids")
    subject_form = rules.form("subject")
    written_subjects = dict(parsed.written_subjects)
    subjects = _refined(subject_form, list(parsed.subjects), written_subjects, "subjects")
    dupes = _repeated(ids)
    if dupes:
        raise unprocessable(
            "duplicate_ids",
            "external ids must be unique (this dataset's ids ignore case"
            + (" and read numbers as numbers)" if rules.numeric else ")"),
            {"duplicates": dupes[:50], "count": len(dupes)},
        )
    return replace(
        parsed,
        ids=Texts(np.array(ids, dtype=Texts.DTYPE)) if isinstance(parsed.ids, Texts) else ids,
        subjects=subjects,
        written_ids=written_ids,
        written_subjects=written_subjects,
    )


def _refined(form: identity.IdForm, values: list[T], written: dict[int, str], what: str) -> list[T]:
    """`values` (canonical texts, or None) in `form`; `written` keeps each changed row's
    former writing."""
    out: list[Any] = []
    for i, value in enumerate(values):
        if value is None:
            out.append(None)
            continue
        try:
            text_ = form.text(value)
        except identity.BadId as exc:
            raise unprocessable(
                "bad_ids", f"{what}, row {i}: {exc}", {"column": what, "row": i}
            ) from None
        if text_ != value:
            written.setdefault(i, value)
        out.append(text_)
    return out
