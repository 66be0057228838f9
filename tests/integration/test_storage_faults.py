"""Faults are faults, not verdicts: a full blob disk makes deletions wait and
retry, with a clear status and a metric, instead of withdrawing the model; a corrupt state of
a model is answered by the exact retrain from the retained rows."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_faults import wait_until
from tests.support.cluster import Cluster


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs (the test runs as root, as on every machine of this project's kind)."""
    where = tmp_path / "blobs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> Path:
    """Write until the device says ENOSPC."""
    filler = where / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError:
            pass
    return filler


def _ready(c, dataset: int) -> int:  # noqa: ANN001
    body = {"name": "m", "dataset_id": dataset, "architecture": {"type": "logreg"}}
    model = c.post("/v1/models", json=body).json()
    wait_until(lambda: c.get(f"/v1/models/{model['id']}").json()["status"] == "ready")
    return int(model["id"])


def _first_train_id(c, dataset: int) -> str:  # noqa: ANN001
    page = c.get(f"/v1/datasets/{dataset}/samples", params={"split": "train", "limit": 1})
    return page.json()["items"][0]["external_id"]


@pytest.mark.integration
def test_a_full_blob_disk_makes_a_deletion_wait_and_not_withdraw(
    tmp_path: Path, small_disk: Path
) -> None:
    cluster = Cluster(
        tmp_path / "serve",
        None,
        None,
        blob_dir=str(small_disk),
        reconcile_seconds=0.5,
        retry_backoff_seconds=[1],
    )
    cluster.start_api()
    with cluster, cluster.client() as c:
        ds = c.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()["id"]
        model = _ready(c, ds)
        filler = fill(small_disk)
        asked = c.post(
            "/v1/deletions", json={"dataset_id": ds, "sample_ids": [_first_train_id(c, ds)]}
        )
        request = asked.json()["id"]

        def waiting() -> bool:
            task = c.get(f"/v1/deletions/{request}").json()["models"][0]
            return task["status"] == "queued" and "ENOSPC" in (task["error"] or "")

        wait_until(waiting, what="the deletion waiting for storage")
        assert c.get(f"/v1/models/{model}").json()["status"] == "ready"  # not withdrawn
        assert "lethe_storage_faults_total" in c.get("/metrics").text
        os.unlink(filler)  # space again: the next retry goes through
        wait_until(lambda: c.get(f"/v1/deletions/{request}").json()["status"] == "done")
        done = c.get(f"/v1/deletions/{request}").json()
        assert done["models"][0]["error"] is None and done["models"][0]["version"] == 2
        view = c.get(f"/v1/models/{model}").json()
        assert view["status"] == "ready" and view["current_version"]["number"] == 2


@pytest.mark.integration
def test_a_corrupt_state_is_answered_by_the_exact_retrain(tmp_path: Path) -> None:
    """One flipped byte in the state's object: the update cannot read it back, so it is the
    exact retrain from the retained rows (the model stays served), not a withdrawal."""
    cluster = Cluster(tmp_path / "serve", None, None, resident_models=0, reconcile_seconds=0.5)
    cluster.start_api()
    with cluster, cluster.client() as c:
        ds = c.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()["id"]
        model = _ready(c, ds)
        states = list((tmp_path / "serve" / "blobs").glob(f"model-{model}/state/*"))
        assert len(states) == 1
        data = bytearray(states[0].read_bytes())
        data[len(data) // 2] ^= 0x01
        states[0].write_bytes(bytes(data))
        answer = c.post(
            "/v1/deletions",
            json={"dataset_id": ds, "sample_ids": [_first_train_id(c, ds)]},
            headers={"Prefer": "wait=60"},
        ).json()
        wait_until(lambda: c.get(f"/v1/deletions/{answer['id']}").json()["status"] == "done")
        cid = c.get(f"/v1/deletions/{answer['id']}").json()["certificate_ids"][0]
        cert = c.get(f"/v1/audit/certificates/{cid}").json()
        assert cert["method"] == "retrain" and cert["guarantee"] == "exact"
        assert "from scratch" in cert["sentence"]
        view = c.get(f"/v1/models/{model}").json()
        assert view["status"] == "ready" and view["current_version"]["kind"] == "retrained"
