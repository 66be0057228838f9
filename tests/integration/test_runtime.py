"""Two Lethe services in one process share nothing: each `create_app` builds its
own Runtime (settings, database, keyring, blob store) and its thread-mode worker its own
JobContext, so nothing a request or a job does reads another service's configuration. Before,
the second app's `use_settings` made every `get_settings()` and `keyring()` of the first one
read the second's database and master key."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.main import create_app
from tests.conftest import SMALL_TRAINING, Api, make_keys


def service(folder: Path) -> tuple[TestClient, Settings]:
    settings = Settings(
        data_dir=folder,
        redis_url=None,
        embedded_worker="thread",
        reconcile_seconds=0.5,
        bootstrap_admin_key=False,
    )
    return TestClient(create_app(settings)), settings


def test_two_services_in_one_process_share_nothing(tmp_path: Path) -> None:
    first_client, first = service(tmp_path / "a")
    second_client, second = service(tmp_path / "b")
    with first_client, second_client:  # both started, the second after the first
        apis = [
            Api(client=c, url=s.resolved_database_url, keys=make_keys(s.resolved_database_url))
            for c, s in ((first_client, first), (second_client, second))
        ]
        a, b = apis
        assert a.runtime.keyring.kek_id != b.runtime.keyring.kek_id  # two master keys
        assert a.worker().db.url == a.url and b.worker().db.url == b.url
        assert a.worker().opened is not b.worker().opened
        for api in apis:
            dataset = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
            model = api.post(
                "/v1/models",
                json={
                    "name": "m",
                    "dataset_id": dataset["id"],
                    "architecture": {"type": "logreg"},
                    "training": SMALL_TRAINING,
                },
            ).json()
            ready = api.wait(f"/v1/models/{model['id']}", ("ready", "failed"))
            assert ready["status"] == "ready", ready  # trained by its own worker, own database
        for api in apis:  # each deletion is applied by its service's worker, in its database
            page = api.get("/v1/datasets/1/samples", params={"split": "train", "limit": 2}).json()
            ids = [s["external_id"] for s in page["items"]]
            created = api.post("/v1/deletions", json={"dataset_id": 1, "sample_ids": ids}).json()
            done = api.wait(f"/v1/deletions/{created['id']}", ("done", "failed"))
            assert done["status"] == "done" and len(done["certificate_ids"]) == 1, done
            subject = api.get("/v1/datasets/1/samples", params={"limit": 5}).json()
            assert subject["total"] > 0  # its rows open under its own master key
        log_a = a.get("/v1/audit/certificates", role="auditor").json()["items"]
        log_b = b.get("/v1/audit/certificates", role="auditor").json()["items"]
        assert len(log_a) == len(log_b) == 1 and log_a[0] != log_b[0]
