"""Registering a dataset a chunk per commit: other writers proceed between chunks,
nothing may use a registering dataset, and a registration that fails or whose process dies
leaves nothing behind."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from app.core.db.session import database
from app.core.db.tables import DataKey, Sample, SampleToken
from app.core.formats import dataset_files
from app.core.schemas import BuiltinDatasetIn
from app.core.services import registration
from app.core.settings import Settings
from tests.conftest import SMALL_TRAINING, Api, paused_app
from tests.support.cluster import Cluster

# Three chunks of registration.CHUNK samples (the last one short).
BIG = {"builtin": "synthetic", "n_samples": 12_000, "n_features": 4, "n_classes": 2}


def logreg(name: str, dataset_id: int) -> dict:
    """A model body: a small logreg on the dataset."""
    return {"name": name, "dataset_id": dataset_id, "architecture": {"type": "logreg"},
            "training": SMALL_TRAINING}  # fmt: skip


def wait_file(path: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)


def counts(url: str, dataset_id: int) -> tuple[int, int, int]:
    """(the dataset's sample rows, its id tokens, all data keys)."""
    with database(url).read() as session:
        samples = session.scalar(
            sa.select(sa.func.count()).select_from(Sample).where(Sample.dataset_id == dataset_id)
        )
        tokens = session.scalar(
            sa.select(sa.func.count())
            .select_from(SampleToken)
            .where(SampleToken.dataset_id == dataset_id)
        )
        keys = session.scalar(sa.select(sa.func.count()).select_from(DataKey))
    return int(samples or 0), int(tokens or 0), int(keys or 0)


def test_other_writers_proceed_between_chunks_and_a_registering_dataset_is_refused(
    paused_api: tuple[Api, Path],
) -> None:
    api, pause = paused_api
    (pause / "registration-chunk-1.go").touch()  # the first dataset registers straight through
    digits = api.post("/v1/datasets", json={"builtin": "digits"}).json()
    assert digits["id"] == 1 and digits["status"] == "ready"
    model = api.post("/v1/models", json=logreg("m", 1)).json()
    assert api.wait(f"/v1/models/{model['id']}", ("ready", "failed"))["status"] == "ready"

    answer: dict[str, httpx.Response] = {}
    thread = threading.Thread(
        target=lambda: answer.update(big=api.post("/v1/datasets", json=BIG)), daemon=True
    )
    thread.start()
    wait_file(pause / "registration-chunk-2.reached")  # its first chunk is committed

    seen = api.get("/v1/datasets/2").json()
    assert seen["status"] == "registering" and seen["n_samples"] == 12_000
    assert seen["progress"]["rows_done"] == registration.CHUNK  # its progress
    assert seen["progress"]["rows_total"] == 12_000 and seen["progress"]["rows_per_second"] > 0
    listed = api.get("/v1/datasets", params={"status": "registering"}).json()["items"]
    assert [d["id"] for d in listed] == [2] and listed[0]["progress"]["rows_done"] > 0
    assert seen["counts"] is None  # not counted on every poll: the progress says it
    one = api.get("/v1/datasets/2/samples", params={"limit": 1}).json()["items"][0]
    refused = [
        api.post(
            "/v1/models", json={"name": "x", "dataset_id": 2, "architecture": {"type": "logreg"}}
        ),  # fmt: skip
        api.post("/v1/deletions", json={"dataset_id": 2, "sample_ids": [one["external_id"]]}),
        api.post("/v1/deletions", json={"dataset_id": 2, "subject_ids": ["nobody"]}),
        api.get("/v1/privacy/methods", params={"dataset": 2, "architecture": "logreg"}),
    ]
    for response in refused:
        assert response.status_code == 409, response.text
        assert response.json()["error"]["code"] == "dataset_registering"

    # The write lock is not held between chunks: a deletion on another dataset is accepted
    # and applied while the registration waits.
    started = time.monotonic()
    deletion = api.post(
        "/v1/deletions", json={"dataset_id": 1, "sample_ids": [api.get(
            "/v1/datasets/1/samples", params={"limit": 1, "split": "train"}
        ).json()["items"][0]["external_id"]]},
    )  # fmt: skip
    assert deletion.status_code == 202, deletion.text
    assert time.monotonic() - started < 10  # SQLite's busy timeout is 30 s
    assert api.wait(f"/v1/deletions/{deletion.json()['id']}", ("done", "failed"))["status"] == (
        "done"
    )

    thread.join(timeout=60)  # answered already: more than 10,000 rows make it a job
    big = answer["big"]
    assert big.status_code == 202, big.text
    assert big.json()["status"] == "registering" and big.headers["location"] == "/v1/datasets/2"
    (pause / "registration-chunk-2.go").touch()
    done = api.wait("/v1/datasets/2", ("ready", "failed"))
    assert done["status"] == "ready" and done["progress"] is None
    assert sum(done["counts"][s] for s in ("train", "test")) == 12_000
    created = api.post("/v1/models", json=logreg("later", 2))
    assert created.status_code == 202, created.text


def test_a_large_synthetic_registration_answers_before_a_row_is_drawn(
    settings: Settings, tmp_path: Path
) -> None:
    """a synthetic builtin's rows are known from its spec, so its POST
    answers 202 with the total while the child is held before drawing a row, where the answer
    waited for the mixture's draws (26 s at a million × 256, bench.registration)."""
    with paused_app(settings, tmp_path, "registration-parse") as (api, pause):
        answer = api.post("/v1/datasets", json=BIG)
        assert answer.status_code == 202, answer.text
        body = answer.json()
        assert body["status"] == "registering" and body["n_samples"] == 12_000
        assert body["progress"]["rows_total"] == 12_000 and body["progress"]["rows_done"] == 0
        held = pause / f"registration-parse-{body['id']}"
        wait_file(held.with_suffix(".reached"))  # the child waits there, nothing drawn
        held.with_suffix(".go").touch()
        done = api.wait(f"/v1/datasets/{body['id']}", ("ready", "failed"))
        assert done["status"] == "ready" and done["n_samples"] == 12_000, done


class FailsSecondCall:
    """Stands in for `real` and counts its calls; the second raises OSError("disk full"): a
    write that fails once one chunk has committed."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real, self.calls = real, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            raise OSError("disk full")
        return self.real(*args, **kwargs)


def register_big_failing(api: Api) -> int:
    """Register BIG as the registration child runs it (app/core/services/isolated.py), here in
    the test's process where a patch applies, expecting "disk full"; the dataset's id."""
    parsed = dataset_files.streamed_builtin(BuiltinDatasetIn.model_validate(BIG))
    with database(api.url).write() as session:
        dataset_id = registration.begin(session, "big", "builtin:synthetic")
    with pytest.raises(OSError, match="disk full"):
        registration.register(api.runtime, dataset_id, parsed)
    return dataset_id


def test_a_registration_that_fails_midway_leaves_nothing(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.post("/v1/datasets", json={"builtin": "breast_cancer"})
    before = counts(api.url, 2)[2]
    failing = FailsSecondCall(registration._commit_chunk)
    monkeypatch.setattr(registration, "_commit_chunk", failing)
    dataset_id = register_big_failing(api)
    assert failing.calls == 2  # the first chunk had committed
    failed = api.get(f"/v1/datasets/{dataset_id}").json()  # its client may have had a 202
    assert failed["status"] == "failed" and failed["error"]["code"] == "registration_failed"
    assert counts(api.url, dataset_id) == (0, 0, before)  # no row, no token, no key
    refused = api.post("/v1/models", json=logreg("m", dataset_id))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "dataset_failed"


@pytest.mark.integration
@pytest.mark.long
def test_a_registration_whose_server_died_is_discarded_with_its_keys(tmp_path: Path) -> None:
    pause = tmp_path / "pause"
    pause.mkdir()
    data = tmp_path / "data"
    with Cluster(data, None, None, pause_dir=pause, pause_at=["registration-chunk"]) as cluster:
        url = cluster.start_api()

        def register() -> None:  # its server is killed mid-way: no answer comes
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"{url}/v1/datasets", json=BIG, timeout=120,
                    headers={"Authorization": f"Bearer {cluster.admin_key}"},
                )  # fmt: skip

        thread = threading.Thread(target=register, daemon=True)
        thread.start()
        wait_file(pause / "registration-chunk-1.reached")
        db_file = data / "lethe.db"
        with sqlite3.connect(db_file) as conn:
            wrapped = [
                bytes(w)
                for (w,) in conn.execute(
                    "SELECT wrapped FROM data_keys JOIN samples ON samples.key_id = data_keys.id"
                )
            ]
        assert len(wrapped) == registration.CHUNK
        assert cluster.api is not None
        cluster.api.send_signal(signal.SIGKILL)  # the server dies between two chunks
        cluster.api.wait(timeout=30)
        thread.join(timeout=30)

        cluster.env["LETHE_REGISTRATION_STALE_SECONDS"] = "1"
        cluster.env["LETHE_PAUSE_AT"] = "[]"
        url = cluster.start_api()  # its reconciler discards the registration
        deadline = time.monotonic() + 60
        with cluster.client() as c:
            while (seen := c.get("/v1/datasets/1").json())["status"] != "failed":
                assert time.monotonic() < deadline, "the registration was never discarded"
                time.sleep(0.2)
        assert seen["error"]["code"] == "registration_abandoned"
        with sqlite3.connect(db_file) as conn:
            assert conn.execute("SELECT count(*) FROM samples").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM sample_tokens").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM data_keys").fetchone() == (0,)
        cluster.stop()
        files = b"".join(
            p.read_bytes()
            for p in (db_file, Path(f"{db_file}-wal"), Path(f"{db_file}-shm"))
            if p.exists()
        )
        assert not [w for w in set(wrapped) if w in files]  # a block's 64 rows share a key
