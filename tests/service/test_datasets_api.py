"""Registering datasets: builtins, .npz and CSV uploads, and every kind of bad file."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import Dataset, Sample, SampleBlock
from app.core.services import isolated
from app.core.settings import Settings
from app.core.storage.crypto import SampleRecord, SealError, open_sealed
from app.core.storage.keystore import load_keys
from app.core.storage.sample_blocks import BLOCK_ROWS, block_aad, open_block, unpack
from tests.conftest import Api


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def upload(api: Api, data: bytes, filename: str = "d.npz", **fields: str):
    return api.post("/v1/datasets", files={"file": (filename, data)}, data=fields)


def n_datasets(api: Api) -> int:
    with database(api.url).write() as session:
        return session.scalar(select(func.count()).select_from(Dataset))


def test_builtin_digits_has_seeded_80_20_split(api: Api, digits: dict) -> None:
    assert digits["n_samples"] == 1797 and digits["n_classes"] == 10
    assert digits["feature_shape"] == [8, 8]
    assert digits["counts"]["train"] == 1437 and digits["counts"]["test"] == 360
    again = api.post("/v1/datasets", json={"builtin": "digits"}).json()
    first = api.get(f"/v1/datasets/{digits['id']}/samples", params={"split": "test"}).json()
    second = api.get(f"/v1/datasets/{again['id']}/samples", params={"split": "test"}).json()
    assert [s["external_id"] for s in first["items"]] == [s["external_id"] for s in second["items"]]


def test_builtin_breast_cancer(api: Api) -> None:
    body = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    assert body["n_samples"] == 569 and body["n_classes"] == 2 and body["feature_shape"] == [30]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_synthetic_subjects_group_consecutive_rows(api: Api, settings: Settings) -> None:
    """a synthetic dataset with subjects, for subject deletions at scale; one over the
    machine's derived cells limit is refused before it is built."""
    body = {"builtin": "synthetic", "n_samples": 200, "subject_size": 50}
    ds = api.post("/v1/datasets", json=body).json()
    page = api.get(f"/v1/datasets/{ds['id']}/samples", params={"subject": "subject-1"}).json()
    assert page["total"] == 50
    assert sorted(int(s["external_id"]) for s in page["items"]) == list(range(50, 100))
    plain = api.post("/v1/datasets", json={"builtin": "synthetic", "n_samples": 20}).json()
    listed = api.get(f"/v1/datasets/{plain['id']}/samples").json()["items"]
    assert all(s["subject_id"] is None for s in listed)
    if settings.dataset_cell_limit >= 4096 * 10_000_000:  # over ~240 GB: no request is over it
        settings.max_dataset_cells = 10**9
    n = settings.dataset_cell_limit // 4096 + 1
    too_big = {"builtin": "synthetic", "n_samples": n, "n_features": 4096}
    refused = api.post("/v1/datasets", json=too_big)
    assert refused.status_code == 422 and "exceeds the limits" in refused.text
    assert "LETHE_MAX_DATASET_CELLS" in refused.json()["error"]["message"]


def test_npz_upload_with_ids_subjects_and_split(api: Api) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 5))
    y = rng.integers(0, 3, size=40)
    ids = np.array([f"s{i}" for i in range(40)])
    subjects = np.array([f"p{i // 4}" for i in range(40)])
    split = np.array(["train"] * 30 + ["test"] * 10)
    response = upload(api, npz_bytes(X=X, y=y, ids=ids, subjects=subjects, split=split))
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["counts"] == {"train": 30, "test": 10, "active": 40}
    page = api.get(f"/v1/datasets/{body['id']}/samples", params={"subject": "p2"}).json()
    assert page["total"] == 4 and {s["external_id"] for s in page["items"]} == {
        "s8",
        "s9",
        "s10",
        "s11",
    }


@pytest.mark.parametrize("shared_memory", [True, False])
def test_csv_upload(api: Api, monkeypatch: pytest.MonkeyPatch, shared_memory: bool) -> None:
    """Parsed in a child process (app/core/services/isolated.py): the upload crosses in shared
    memory, or through the pipe where /dev/shm is too small for it."""
    monkeypatch.setattr(isolated, "_fits_in_shared_memory", lambda size: shared_memory)
    rows = ["id,f1,f2,label,person"] + [f"r{i},{i * 0.1},{-i},{i % 2},u{i % 5}" for i in range(20)]
    response = upload(
        api, "\n".join(rows).encode(), "data.csv", id_column="id", subject_column="person"
    )
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["feature_shape"] == [2] and body["n_classes"] == 2 and body["n_samples"] == 20


def test_an_upload_s_segment_is_zeroed_in_place_and_can_be_released() -> None:
    """The shared-memory segment's cleanup (`isolated.zero`, one memset) leaves no byte of the
    upload, and ends its own export of the buffer, which is then released and unlinked."""
    from multiprocessing import shared_memory

    memory = shared_memory.SharedMemory(create=True, size=3 * 4096 + 5)
    try:
        buffer = memory.buf
        assert buffer is not None
        buffer[:] = b"\x07" * memory.size
        isolated.zero(buffer)
        assert bytes(buffer) == bytes(memory.size)
        buffer.release()
        isolated.zero(memoryview(bytearray()))  # an empty upload's: nothing to do
    finally:
        memory.close()
        memory.unlink()


@pytest.mark.parametrize(
    "arrays,code",
    [
        ({"X": np.array([[1.0, np.nan]]), "y": np.array([0])}, "non_finite"),
        ({"X": np.array([[1.0, np.inf], [0, 0]]), "y": np.array([0, 1])}, "non_finite"),
        ({"X": np.ones((3, 2)), "y": np.array([0, 1])}, "bad_shape"),
        ({"X": np.ones(3), "y": np.array([0, 1, 0])}, "bad_shape"),
        ({"X": np.ones((3, 2)), "y": np.array([0, -1, 0])}, "labels_out_of_range"),
        ({"X": np.ones((3, 2)), "y": np.array([0.5, 1, 0])}, "bad_labels"),
        (
            {"X": np.ones((3, 2)), "y": np.array([0, 1, 0]), "ids": np.array(["a", "b", "a"])},
            "duplicate_ids",
        ),
        ({"X": np.ones((3, 2))}, "malformed_npz"),
        (
            {
                "X": np.ones((3, 2)),
                "y": np.array([0, 1, 0]),
                "split": np.array(["train", "x", "y"]),
            },
            "bad_split",
        ),
        ({"X": np.array([["a", "b"]]), "y": np.array([0])}, "bad_dtype"),
    ],
)
def test_bad_npz_is_422_and_writes_nothing(api: Api, arrays: dict, code: str) -> None:
    response = upload(api, npz_bytes(**arrays))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == code
    assert n_datasets(api) == 0


def test_pickled_npz_is_refused(api: Api) -> None:
    data = npz_bytes(X=np.array([[1.0]], dtype=object), y=np.array([0]))
    response = upload(api, data)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "malformed_npz"


def test_garbage_and_bad_csv(api: Api) -> None:
    assert upload(api, b"not a zip").json()["error"]["code"] == "malformed_npz"
    bad = upload(api, b"a,b\n1,2\n", "x.csv")
    assert bad.status_code == 422 and "label" in bad.json()["error"]["message"]
    ragged = upload(api, b"a,label\n1,0\n2\n", "x.csv")
    assert ragged.status_code == 422 and ragged.json()["error"]["details"]["lines"] == [3]
    nan = upload(api, b"a,label\nnan,0\n", "x.csv")
    assert nan.json()["error"]["code"] == "non_finite"
    assert n_datasets(api) == 0


def test_upload_over_limit_is_413(api: Api) -> None:
    big = npz_bytes(X=np.zeros((300_000, 1)), y=np.zeros(300_000, dtype=int))
    response = upload(api, big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert n_datasets(api) == 0


def test_unknown_dataset_and_bad_builtin(api: Api) -> None:
    assert api.get("/v1/datasets/999").status_code == 404
    assert api.get("/v1/datasets/999").json()["error"]["code"] == "dataset_not_found"
    bad = api.post("/v1/datasets", json={"builtin": "mnist"})
    assert bad.status_code == 422
    nan = api.post(
        "/v1/datasets",
        content=b'{"builtin": "digits", "test_fraction": NaN}',
        headers={"Content-Type": "application/json"},
    )
    assert nan.status_code == 422
    assert (
        api.post(
            "/v1/datasets", content=b"{", headers={"Content-Type": "application/json"}
        ).status_code
        == 422
    )
    assert (
        api.post("/v1/datasets", content=b"x", headers={"Content-Type": "text/plain"}).status_code
        == 415
    )


def test_samples_are_sealed_float32_records(api: Api, digits: dict) -> None:
    """A registered row's record is in its block, which opens with the row's data key (the
    block's) to the label, ids and 64 float32 features; the database holds neither the raw
    features nor the raw id, and the row has no payload of its own."""
    from sklearn.datasets import load_digits

    with database(api.url).write() as session:
        row = session.execute(
            select(Sample).where(Sample.dataset_id == digits["id"]).order_by(Sample.id).limit(1)
        ).scalar_one()
        ring = api.runtime.keyring
        assert row.key_id is not None and row.block_row == 0 and row.payload is None
        key = load_keys(session, ring, [row.key_id])[row.key_id]
        block = session.get(SampleBlock, row.key_id)
        assert block is not None and block.dataset_id == digits["id"]
        sealed = block.data
    assert row.external_id == ring.token("sample", digits["id"], "0")
    features = (load_digits().images[0] / 16.0).astype(np.float32).tobytes()
    assert features not in sealed
    records = unpack(open_block(key, digits["id"], row.key_id, sealed))
    assert len(records) == BLOCK_ROWS  # digits: 1,797 rows, blocks of BLOCK_ROWS
    record = SampleRecord.decode(bytes(records[row.block_row]))
    assert (record.external_id, record.subject_id, record.label) == ("0", None, 0)
    assert record.features == features
    with pytest.raises(SealError):  # bound to its dataset: another's AAD does not open it
        open_sealed(key, sealed, block_aad(digits["id"] + 1, row.key_id))


def test_extreme_split_and_out_of_range_numbers_are_not_server_errors(api: Api) -> None:
    """Found by fuzzing the OpenAPI schema (schemathesis): both used to answer 500."""
    tiny_train = api.post(
        "/v1/datasets", json={"builtin": "digits", "test_fraction": 0.9999999999999999}
    )
    assert tiny_train.status_code == 201 and tiny_train.json()["counts"]["train"] == 1
    huge = 112086311194753744896
    for path, params in [
        ("/v1/datasets/1/samples", {"offset": huge}),
        (f"/v1/models/{huge}", {}),
        (f"/v1/datasets/{huge}", {}),
        ("/v1/audit/certificates", {"model": huge}),
    ]:
        response = api.get(path, params=params)
        assert response.status_code in (404, 422), (path, response.status_code)
        assert "error" in response.json()
    body = api.post("/v1/models", json={"name": "x", "dataset_id": huge})
    assert body.status_code in (404, 422) and "error" in body.json()


def test_the_synthetic_mixture_is_scikit_learns_for_the_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """generated in float32 with less memory, the values are still exactly
    `make_classification(..., random_state=seed)`'s, so a seed names the same dataset."""
    from sklearn import datasets as skd

    from app.core.formats import synthetic_mixture
    from app.core.formats.dataset_files import load_builtin
    from app.core.schemas import BuiltinDatasetIn

    shapes = [(500, 12, 3, 7, 8_192), (500, 12, 3, 7, 37), (300, 6, 3, 1, 64), (999, 2, 2, 5, 100)]
    shapes += [(10, 64, 50, 3, 4)]  # fewer rows than classes: clusters with no rows
    for n, p, k, seed, block in shapes:  # blocks that cut the rows unevenly, no noise columns
        monkeypatch.setattr(synthetic_mixture, "GENERATION_BLOCK", block)
        spec = BuiltinDatasetIn(
            builtin="synthetic", n_samples=n, n_features=p, n_classes=k, seed=seed
        )
        parsed = load_builtin(spec)
        X, y = skd.make_classification(
            n_samples=n, n_features=p, n_informative=max(2, min(p, 2 * k)), n_redundant=0,
            n_classes=k, n_clusters_per_class=1, random_state=seed,
        )  # fmt: skip
        assert np.array_equal(parsed.X, X.astype(np.float32)) and np.array_equal(parsed.y, y)


def test_the_streamed_mixture_gives_every_row_what_the_whole_one_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """registration reads the synthetic mixture's rows in the order they are
    drawn, a block at a time, each under the id (scikit-learn's row number) whose features,
    label, split and subject the whole array gives it, as registration reads them (slices
    across blocks, single rows after a skip, a mask of the rows kept)."""
    from app.core.formats import synthetic_mixture
    from app.core.formats.dataset_files import load_builtin, streamed_builtin
    from app.core.schemas import BuiltinDatasetIn
    from app.core.services.registration import _features

    monkeypatch.setattr(synthetic_mixture, "GENERATION_BLOCK", 37)
    spec = BuiltinDatasetIn(
        builtin="synthetic", n_samples=500, n_features=12, n_classes=3, seed=7, subject_size=3
    )
    whole, streamed = load_builtin(spec), streamed_builtin(spec)
    assert streamed.numbered and not whole.numbered
    at = np.array([int(i) for i in streamed.ids])
    assert sorted(at) == list(range(500)) and not np.array_equal(at, np.arange(500))
    assert isinstance(streamed.X, synthetic_mixture.MixtureRows) and streamed.X.shape == (500, 12)
    read = np.concatenate(
        [_features(streamed, range(a, min(a + 60, 500))) for a in range(0, 500, 60)]
    )
    assert np.array_equal(read, whole.X[at])
    skipped = [i for i in range(100, 200) if i % 7]  # a chunk with rows left out
    assert np.array_equal(_features(streamed, skipped), whole.X[at[skipped]])
    assert np.array_equal(_features(streamed, range(0, 40)), whole.X[at[:40]])  # from the start
    kept = at % 2 == 0
    assert np.array_equal(streamed.X[kept][0:250], whole.X[at[kept]])
    assert np.array_equal(streamed.y, whole.y[at])
    assert list(streamed.split) == [whole.split[i] for i in at]
    assert list(streamed.subjects) == [whole.subjects[i] for i in at]
    assert streamed.n_classes == whole.n_classes and streamed.kind == whole.kind
    streamed.X.release()


def test_the_synthetic_mixture_is_generated_in_its_float32_array() -> None:
    """200,000 × 128 (97.7 MiB of float32) grows the peak RSS (scikit-learn's
    import included) by less than 2.5 × the float32 array: `make_classification`'s float64
    with its float32 cast would be 3 × (measured: 4.0 × before, 1.74 × now)."""
    script = (
        "import resource\n"
        "from app.core.schemas import BuiltinDatasetIn\n"
        "from app.core.formats.dataset_files import load_builtin\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "spec = BuiltinDatasetIn(builtin='synthetic', n_samples=200000, n_features=128,"
        " n_classes=10)\n"
        "parsed = load_builtin(spec)\n"
        "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(grown * 1024 / parsed.X.nbytes)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert float(out.stdout.split()[-1]) < 2.5


def streamed_growth(n: int, p: int, read: str, before: str = "") -> tuple[int, float]:
    """In a fresh interpreter, after the statement `before`: a synthetic builtin of n × p,
    10 classes, made for registration and its rows read by `read` (an expression of
    `parsed`); (rows read, peak RSS grown / the rows' float32 bytes)."""
    script = (
        "import resource\n"
        "from app.core.schemas import BuiltinDatasetIn\n"
        "from app.core.formats.dataset_files import streamed_builtin\n"
        "from app.core.services.registration import _features\n"
        f"{before}\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"spec = BuiltinDatasetIn(builtin='synthetic', n_samples={n}, n_features={p},"
        " n_classes=10)\n"
        "parsed = streamed_builtin(spec)\n"
        f"rows = {read}\n"
        "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        f"print(rows, grown * 1024 / ({n} * {p} * 4))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    rows, ratio = out.stdout.split()[-2:]
    return int(rows), float(ratio)


def test_the_streamed_mixture_is_never_whole_in_memory() -> None:
    """registration's reading of 100,000 × 512 synthetic rows (195 MiB of
    float32), a 5,000-row chunk at a time as it seals them, grows the peak RSS (scikit-learn's
    import included) by less than 0.75 × the array (measured: 0.55 ×; the whole array, 1.46 ×):
    one generation block and its scratch, not the rows."""
    chunks = "sum(len(_features(parsed, range(a, a + 5000))) for a in range(0, 100000, 5000))"
    rows, ratio = streamed_growth(100_000, 512, chunks)
    assert rows == 100_000 and ratio < 0.75


def test_the_streamed_mixture_holds_no_informative_draw() -> None:
    """a mixture of informative columns only (400,000 × 20, 30.5 MiB of
    float32), made and read a block at a time, grows the peak RSS by less than 3 × its float32
    array: scikit-learn's zeroed float64 array of centroids (2 ×) and the rows' names, not its
    informative draw (measured: 4.0 × when it drew them whole and kept them, 2.47 × now)."""
    blocks = "sum(len(block) for _, block in parsed.X.mixture.blocks())"
    rows, ratio = streamed_growth(400_000, 20, blocks, "import sklearn.datasets, threadpoolctl")
    assert rows == 400_000 and ratio < 3.0


def test_the_datasets_are_listed_newest_first_paged_and_by_status(api: Api) -> None:
    """GET /v1/datasets (was 405) lists them for every role, newest first,
    a page at a time, filtered by status; a dataset still registering is listed as such."""
    made = [upload(api, npz_bytes(X=np.eye(4, dtype=np.float32), y=np.arange(4) % 2)).json()["id"]]
    made += [api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()["id"]]
    with database(api.url).write() as session:  # as a registration under way leaves it
        session.get(Dataset, made[0]).status = "registering"
    page = api.get("/v1/datasets").json()
    assert [d["id"] for d in page["items"]][:2] == made[::-1]
    assert page["total"] == n_datasets(api) and page["offset"] == 0
    first = page["items"][0]
    assert first["source"] == "builtin:breast_cancer" and first["n_samples"] == 569
    assert first["status"] == "ready" and first["feature_shape"] == [30]
    assert "counts" not in first  # the list counts no dataset's rows
    ready = api.get("/v1/datasets", params={"status": "ready"}).json()
    assert made[0] not in [d["id"] for d in ready["items"]]
    registering = api.get("/v1/datasets", params={"status": "registering"}).json()
    assert [d["id"] for d in registering["items"]] == [made[0]]
    second = api.get("/v1/datasets", params={"offset": 1, "limit": 1}).json()
    assert [d["id"] for d in second["items"]] == [made[0]] and second["limit"] == 1
    assert api.get("/v1/datasets", params={"status": "gone"}).status_code == 422
    assert api.get("/v1/datasets", params={"limit": 0}).status_code == 422
    reader = api.get("/v1/datasets", headers={"Authorization": f"Bearer {api.keys['requester']}"})
    assert reader.status_code == 200 and reader.json()["total"] == page["total"]
    assert api.client.get("/v1/datasets").status_code == 401  # no key


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # not a dialect's behaviour
def test_a_registration_of_more_than_ten_thousand_rows_is_a_job(api: Api) -> None:
    """once the parse finds more than 10,000 rows the POST answers 202
    (status registering, its progress, a Location to poll) and the registration goes on;
    smaller ones answer 201 as before."""
    small = api.post("/v1/datasets", json={"builtin": "synthetic", "n_samples": 10_000})
    assert small.status_code == 201 and small.json()["status"] == "ready"
    answer = api.post(
        "/v1/datasets", json={"builtin": "synthetic", "n_samples": 12_000, "n_features": 4}
    )
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert answer.headers["location"] == f"/v1/datasets/{body['id']}"
    assert body["status"] in ("registering", "ready")  # it may finish as the answer is read
    if body["status"] == "registering":
        assert body["progress"]["rows_total"] == 12_000
        assert 0 <= body["progress"]["rows_done"] <= 12_000
    done = api.wait(f"/v1/datasets/{body['id']}", ("ready", "failed"))
    assert done["status"] == "ready" and done["n_samples"] == 12_000 and done["progress"] is None
    assert sum(done["counts"][s] for s in ("train", "test")) == 12_000
