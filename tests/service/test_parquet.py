"""Parquet uploads: a column mapping, features as a list column or named
columns, read a row group at a time; every malformed file a 422 naming column and row (a
feature's when its rows are read: the POST's own, or past INLINE_ROWS the failed job's)."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import DataKey, Sample, SampleBlock
from app.core.errors import APIError
from app.core.formats import parquet_files
from app.core.formats.dataset_files import Limits
from app.core.formats.parquet_files import Columns, parse_parquet
from tests.conftest import Api

N, D = 50, 6


def table(features: str = "fixed", **changes: object) -> pa.Table:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((N, D)).astype(np.float32)
    columns: dict[str, object] = {
        "person_key": [f"k-{i:03d}" for i in range(N)],
        "who": [f"w{i // 5}" if i % 7 else None for i in range(N)],
        "target": (X[:, 0] > 0).astype(np.int64),
        "part": ["test" if i % 4 == 0 else "train" for i in range(N)],
    }
    if features == "fixed":
        columns["vec"] = pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), D)
    elif features == "list":
        columns["vec"] = pa.array([list(map(float, row)) for row in X], pa.list_(pa.float64()))
    else:
        for j in range(D):
            columns[f"f{j}"] = X[:, j].astype(np.float64)
    columns.update(changes)
    return pa.table(columns)


def parquet(t: pa.Table, row_group_size: int = 16) -> bytes:
    buf = io.BytesIO()
    pq.write_table(t, buf, row_group_size=row_group_size)
    return buf.getvalue()


MAPPED = Columns(label="target", id="person_key", subject="who", split="part")


@pytest.mark.parametrize("features", ["fixed", "list", "named"])
def test_every_feature_layout_reads_back_row_for_row(features: str) -> None:
    source = table(features)
    mapping = MAPPED if features != "named" else Columns(**{**MAPPED.__dict__, "features": ()})
    parsed = parse_parquet(parquet(source), mapping, 0, 0.2, Limits())
    named = table("named")
    X = np.stack([named.column(f"f{j}").to_numpy() for j in range(D)], 1).astype(np.float32)
    np.testing.assert_array_equal(parsed.X, X)  # four row groups, in order
    assert list(parsed.ids) == source.column("person_key").to_pylist()
    assert list(parsed.subjects) == source.column("who").to_pylist()
    assert parsed.split == source.column("part").to_pylist()
    assert parsed.y.tolist() == source.column("target").to_pylist()


def test_a_row_group_is_read_in_batches_never_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """One row group of 50 rows read 5 rows at a time (BATCH_BYTES), in order, with a row
    mask (on_erased: skip) and a read back from an earlier row."""
    monkeypatch.setattr(parquet_files, "BATCH_BYTES", 5 * 4 * D)
    source = table("fixed")
    parsed = parse_parquet(parquet(source, row_group_size=N), MAPPED, 0, 0.2, Limits())
    expected = np.stack(source.column("vec").to_numpy(zero_copy_only=False)).astype(np.float32)
    rows = parsed.X
    assert isinstance(rows, parquet_files.ParquetRows)
    decoded: list[int] = []
    real = parquet_files._feature_block
    monkeypatch.setattr(
        parquet_files,
        "_feature_block",
        lambda table, *args: decoded.append(table.num_rows) or real(table, *args),
    )
    np.testing.assert_array_equal(np.stack([rows[i] for i in range(N)]), expected)
    assert decoded == [5] * (N // 5)
    keep = np.arange(N) % 3 != 0
    kept = rows[keep]
    np.testing.assert_array_equal(np.stack([kept[i] for i in range(len(kept))]), expected[keep])
    np.testing.assert_array_equal(rows[2], expected[2])  # an earlier row: read from the start


def test_a_run_of_rows_is_read_as_slices_of_its_batches() -> None:
    """`X[a:b]` (how a registration reads a chunk): the rows, across batch boundaries and
    after rows are left out, equal to the array's; a view where one batch holds them."""
    n, d = 3000, 7
    X = np.random.default_rng(4).standard_normal((n, d)).astype(np.float32)
    t = pa.table(
        {"person_key": [f"k{i}" for i in range(n)], "target": np.arange(n) % 2,
         "vec": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), d)}
    )  # fmt: skip
    parsed = parse_parquet(parquet(t, 700), Columns(label="target", id="person_key"), 0, 0.2,
                           Limits())  # fmt: skip
    for a, b in [(0, n), (650, 760), (10, 20), (2999, 3000), (5, 5)]:
        np.testing.assert_array_equal(parsed.X[a:b], X[a:b])
    keep = np.ones(n, dtype=bool)
    keep[[3, 4, 699, 700, 1500]] = False
    kept = parsed.X[keep]
    np.testing.assert_array_equal(kept[0 : len(kept)], X[keep])
    np.testing.assert_array_equal(kept[690:705], X[keep][690:705])
    parsed.X.release()  # the reader let go: a later read starts it again
    np.testing.assert_array_equal(parsed.X[100:110], X[100:110])


def test_named_feature_columns_are_chosen_by_the_mapping() -> None:
    mapping = Columns(label="target", id="person_key", features=("f4", "f1"))
    parsed = parse_parquet(parquet(table("named")), mapping, 0, 0.2, Limits())
    source = table("named")
    expected = np.stack([source.column("f4").to_numpy(), source.column("f1").to_numpy()], 1)
    np.testing.assert_array_equal(parsed.X, expected.astype(np.float32))
    assert set(parsed.split) == {"train", "test"}  # no split column: the seeded rule


def refusal(data: bytes, mapping: Columns = MAPPED, limits: Limits | None = None) -> APIError:
    """The file's refusal: from its parse, or (a feature) when its rows are read."""
    with pytest.raises(APIError) as caught:
        parsed = parse_parquet(data, mapping, 0, 0.2, limits or Limits())
        for i in range(len(parsed.X)):
            parsed.X[i]
    return caught.value


def test_the_parse_reads_no_feature_and_the_rows_read_each_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    real = parquet_files._feature_block

    def counting(batch: pa.RecordBatch, *args: object) -> np.ndarray:
        decoded.append(batch.num_rows)
        return real(batch, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(parquet_files, "_feature_block", counting)
    parsed = parse_parquet(parquet(table()), MAPPED, 0, 0.2, Limits())
    assert decoded == [] and len(parsed.ids) == N  # the ids, labels, subjects and splits only
    rows = [parsed.X[i] for i in range(N)]
    assert sum(decoded) == N and len(rows) == N  # each row's features decoded once


def test_malformed_files_name_the_column_and_the_row() -> None:
    X = np.random.default_rng(0).standard_normal((N, D))
    X[37, 2] = np.nan
    nan = refusal(parquet(table("named", f2=X[:, 2])), Columns(label="target", id="person_key"))
    assert nan.status == 422 and nan.details == {"column": "f2", "row": 37}

    rows = [[1.0] * D for _ in range(N)]
    rows[21] = [1.0] * (D - 1)
    ragged = refusal(parquet(table("list", vec=pa.array(rows, pa.list_(pa.float64())))))
    assert ragged.details == {"column": "vec", "row": 21} and "5 features" in ragged.message

    missing = refusal(parquet(table()), Columns(label="target", id="nobody"))
    assert missing.code == "missing_column" and missing.details["column"] == "nobody"

    text = refusal(parquet(table("named", f3=["x"] * N)), Columns(label="target", features=("f3",)))
    assert text.code == "bad_dtype" and text.details == {"column": "f3"}

    labels = [1] * N
    labels[44] = None
    no_label = refusal(parquet(table(target=pa.array(labels, pa.int64()))))
    assert no_label.details == {"column": "target", "row": 44}

    ids = [f"k{i}" for i in range(N)]
    ids[3] = None
    assert refusal(parquet(table(person_key=ids))).details == {"column": "person_key", "row": 3}

    assert refusal(b"PAR1 but not really").code == "malformed_parquet"
    too_many = refusal(parquet(table()), limits=Limits(max_samples=10))
    assert too_many.status == 413  # from the footer, before a row group is read

    twice = table(person_key=["same"] * N)
    assert refusal(parquet(twice)).code == "duplicate_ids"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # not a dialect's behaviour
def test_a_parquet_upload_with_a_column_mapping(api: Api) -> None:
    data = parquet(table())
    form = {
        "label_column": "target",
        "id_column": "person_key",
        "subject_column": "who",
        "split_column": "part",
        "name": "people",
    }
    made = api.post("/v1/datasets", files={"file": ("people.parquet", data)}, data=form)
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["source"] == "parquet" and body["n_samples"] == N
    assert body["feature_shape"] == [D] and body["counts"]["test"] == N // 4 + 1
    page = api.get(f"/v1/datasets/{body['id']}/samples", params={"subject": "w1"}).json()
    assert sorted(s["external_id"] for s in page["items"]) == ["k-005", "k-006", "k-008", "k-009"]
    bad = api.post(
        "/v1/datasets", files={"file": ("p.parquet", data)}, data={**form, "id_column": "nope"}
    )
    assert bad.status_code == 422 and bad.json()["error"]["details"]["column"] == "nope"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # not a dialect's behaviour
def test_a_csv_takes_a_feature_mapping(api: Api) -> None:
    rows = ["id,a,b,c,label"] + [f"r{i},{i},{i * 2},{i * 3},{i % 2}" for i in range(20)]
    data = ("\n".join(rows) + "\n").encode()
    made = api.post(
        "/v1/datasets",
        files={"file": ("t.csv", data)},
        data={"id_column": "id", "feature_columns": "c, a"},
    )
    assert made.status_code == 201, made.text
    assert made.json()["feature_shape"] == [2]
    missing = api.post(
        "/v1/datasets",
        files={"file": ("t.csv", data)},
        data={"id_column": "id", "feature_columns": "c,zz"},
    )
    assert missing.status_code == 422 and "zz" in missing.json()["error"]["message"]


def test_a_malformed_feature_fails_the_job_and_leaves_nothing(api: Api) -> None:
    """Past INLINE_ROWS the POST answers 202 once the ids and labels are read; a bad feature
    further on fails the job as its batch is registered, naming the column and the row, and
    what was written before it is discarded. A small file's is the POST's own 422."""
    n, d, bad = 12_000, 4, 11_500
    X = np.random.default_rng(5).standard_normal((n, d)).astype(np.float32)
    X[bad, 1] = np.inf
    big = pa.table(
        {
            "person_key": [f"p{i}" for i in range(n)],
            "target": (X[:, 0] > 0).astype(np.int64),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), d),
        }
    )
    form = {"label_column": "target", "id_column": "person_key"}
    started = api.post(
        "/v1/datasets", files={"file": ("big.parquet", parquet(big, 4096))}, data=form
    )
    assert started.status_code == 202, started.text
    failed = api.wait(f"/v1/datasets/{started.json()['id']}", ("ready", "failed"))
    assert failed["status"] == "failed", failed
    assert failed["error"]["details"] == {"column": "vec", "row": bad}
    assert failed["error"]["status"] == 422
    with database(api.url).read() as session:
        for table_ in (Sample, SampleBlock, DataKey):
            assert not session.scalar(select(func.count()).select_from(table_)), table_
    small = api.post(
        "/v1/datasets", files={"file": ("s.parquet", parquet(big.slice(11_000), 256))}, data=form
    )
    assert small.status_code == 422, small.text
    assert small.json()["error"]["details"] == {"column": "vec", "row": bad - 11_000}
