"""MLflow: with `LETHE_MLFLOW_TRACKING_URI` set, every version Lethe
publishes appears as a version of an MLflow registered model, its weights the artifact and its
certificate in its tags, the alias `current` on Lethe's current version; a version Lethe purges
loses its artifact in MLflow too. Against a real `mlflow server` (SQLite backend, artifacts
served through it) started by the test."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient
from playwright.sync_api import sync_playwright

from app.core.mlflow_export.registry import ALIAS, MlflowRegistry, VersionCopy
from tests.integration.test_dashboard import CHROMIUM, sign_in
from tests.integration.test_walkthrough import readme_block
from tests.support.cluster import Cluster
from tests.support.servers import MlflowServer

pytestmark = pytest.mark.integration


@pytest.fixture
def mlflow_server(tmp_path: Path) -> Iterator[MlflowServer]:
    server = MlflowServer(tmp_path / "mlflow")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def wait_for(what: str, check, timeout: float = 180.0):  # noqa: ANN001, ANN201
    """`check()` until it returns something truthy: the syncer's copy is an event this test
    cannot subscribe to; the limit only stops a test that would otherwise hang."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def run_readme_block(url: str, key: str, mlflow: str) -> str:
    """The docs' MLflow block, as written, against this service and tracking server."""
    block = readme_block("# MLflow", "docs/integrations/mlflow.md")
    env = {**os.environ, "KEY": key, "L": url, "MLFLOW": mlflow}
    done = subprocess.run(
        ["bash", "-c", block], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def dashboard_mlflow_cells(url: str, key: str, model: int) -> list[tuple[str, str]]:
    """The MLflow column of the model page's version chain, in Chromium: (status, text)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        sign_in(page, url, key)
        page.goto(f"{url}/ui#/models/{model}")
        page.wait_for_selector("#versions td.mlflow")
        cells = [
            (c.get_attribute("data-status") or "", c.inner_text().strip())
            for c in page.locator("#versions td.mlflow").all()
        ]
        browser.close()
    return cells


def digits_model(c: httpx.Client) -> tuple[int, int]:
    """The digits dataset and a model trained on it, queued: (dataset id, model id)."""
    dataset = c.post("/v1/datasets", json={"builtin": "digits"}).json()["id"]
    spec = {"name": "digits", "dataset_id": dataset, "training": {"epochs": 2}}
    return dataset, c.post("/v1/models", json=spec).json()["id"]


def mlflow_copy_cells(url: str, key: str, version_id: int) -> list[str]:
    """The integrations page's row of one MLflow copy, in Chromium: status, failed attempts,
    last error."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        sign_in(page, url, key)
        page.goto(f"{url}/ui#/webhooks")
        row = page.locator(f'#mlflow-copies tr[data-version-id="{version_id}"]')
        row.wait_for()
        cells = row.locator("td").all_inner_texts()
        assert row.locator("button.retry").count() == 1  # a pending copy can be tried now
        browser.close()
    return [cells[2], cells[3], cells[4]]


@pytest.mark.long
def test_every_version_reaches_mlflow_and_a_purged_one_leaves_it(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    settings = {"mlflow_tracking_uri": mlflow_server.url, "mlflow_poll_seconds": 0.2}
    mlflow = MlflowClient(tracking_uri=mlflow_server.url, registry_uri=mlflow_server.url)
    with Cluster(tmp_path / "data", None, None, **settings) as cluster:
        url = cluster.start_api()
        with cluster.client() as c:
            dataset, model = digits_model(c)
            name = f"lethe-model-{model}"

            def current() -> object:
                try:
                    return mlflow.get_model_version_by_alias(name, ALIAS)
                except Exception:  # not registered yet
                    return None

            v1 = wait_for("version 1 in MLflow", current)
            assert v1.tags["lethe.version"] == "1" and v1.tags["lethe.guarantee"] == "trained"
            ids = [
                s["external_id"]
                for s in c.get(
                    f"/v1/datasets/{dataset}/samples", params={"split": "train", "limit": 2}
                ).json()["items"]
            ]
            request = c.post(
                "/v1/deletions",
                json={"dataset_id": dataset, "sample_ids": ids},
                headers={"Prefer": "wait=120"},
            ).json()
            assert request["status"] == "done", request
            ours = {v["number"]: v for v in c.get(f"/v1/models/{model}/versions").json()}
            certificate = c.get(f"/v1/audit/certificates/{request['models'][0]['certificate_id']}")
            assert certificate.status_code == 200, certificate.text
            cert = certificate.json()

            def moved() -> object:
                got = current()
                return got if got is not None and got.tags["lethe.version"] == "2" else None

            v2 = wait_for("version 2 as MLflow's current", moved)

            def v1_purged() -> object:
                got = mlflow.get_model_version(name, v1.version)
                return got if "lethe.purged" in got.tags else None

            wait_for("version 1's artifact deleted from MLflow", v1_purged)

            def both_shown() -> object:
                listed = c.get(f"/v1/models/{model}/versions").json()
                statuses = [(v["mlflow"] or {}).get("status") for v in listed]
                return listed if statuses == ["purged", "registered"] else None

            shown = wait_for("Lethe to show both copies", both_shown)
            weights = c.get(f"/v1/models/{model}/versions/2/weights").content
            cells = dashboard_mlflow_cells(url, cluster.admin_key, model)
        walked = run_readme_block(url, cluster.admin_key, mlflow_server.url)

    # the copy: the released bytes, tagged with what the certificate states
    assert v2.tags["lethe.weights_sha256"] == ours[2]["weights_sha256"]
    assert v2.tags["lethe.certificate_ids"] == str(cert["id"])
    assert v2.tags["lethe.guarantee"] == cert["guarantee"]
    assert float(v2.tags["lethe.epsilon"]) == cert["epsilon"]
    assert v2.tags["lethe.parent_version"] == "1" and v2.tags["lethe.rows_removed"] == "2"
    got = mlflow.download_artifacts(v2.run_id, "weights/model.safetensors", str(tmp_path))
    assert hashlib.sha256(Path(got).read_bytes()).hexdigest() == ours[2]["weights_sha256"]
    assert Path(got).read_bytes() == weights
    assert shown[1]["mlflow"]["version"] == v2.version
    # the dashboard's version chain shows each copy as the API does
    assert cells == [("purged", f"purged as {name} v{v1.version}"),
                     ("registered", f"registered as {name} v{v2.version}")]  # fmt: skip
    # the README's block: the second model's version 2 is MLflow's current, tagged as certified
    lines = walked.splitlines()
    assert json.loads(lines[0])["status"] == "done"
    assert [json.loads(line) for line in lines[1:3]] == [
        {"number": 1, "kind": "trained", "mlflow": "purged"},
        {"number": 2, "kind": "retrained", "mlflow": "registered"},  # digits' default: exact
    ]
    current = json.loads(lines[3])
    assert current["name"] == f"lethe-model-{model + 1}" and current["version"] == "2"
    tags = current["lethe"]
    assert tags["lethe.version"] == "2" and tags["lethe.rows_removed"] == "2"
    assert tags["lethe.guarantee"] == "exact" and float(tags["lethe.epsilon"]) == 0
    # the purge: nothing of version 1's weights is left in MLflow's artifact store
    assert mlflow.list_artifacts(v1.run_id, "weights") == []
    stored = files_under(mlflow_server.artifacts)
    assert all(hashlib.sha256(b).hexdigest() != ours[1]["weights_sha256"] for b in stored.values())
    assert any(hashlib.sha256(b).hexdigest() == ours[2]["weights_sha256"] for b in stored.values())
    # the erased ids are in no tag
    for version in (v1, v2):
        assert not any(i in value for value in version.tags.values() for i in ids if len(i) > 2)

    # registering again (a crash between MLflow's change and Lethe's commit) makes nothing new
    registry = MlflowRegistry(mlflow_server.url, "lethe", "lethe-model-")
    again = registry.register(
        VersionCopy(int(v2.tags["lethe.version_id"]), model, "digits", 2, weights, {}, True)
    )
    assert again.mlflow_version == v2.version
    assert len(mlflow.search_model_versions(f"name='{name}'")) == 2


def test_an_mlflow_outage_shows_as_counted_attempts_and_heals(
    mlflow_server: MlflowServer, tmp_path: Path
) -> None:
    """MLflow is down when the first version is published: the copy shows its failed
    attempts and the last error at once (MLflow's client no longer retries inside one call
    for a minute), `/metrics` counts the failures, and once MLflow answers the copy is
    registered."""
    mlflow_server.kill()  # not started yet: its port refuses
    settings = {"mlflow_tracking_uri": mlflow_server.url, "mlflow_poll_seconds": 0.2}
    with Cluster(tmp_path / "data", None, None, **settings) as cluster:
        url = cluster.start_api()
        with cluster.client() as c:
            _, model = digits_model(c)

            def copy() -> dict:
                versions = c.get(f"/v1/models/{model}/versions").json()
                return (versions[0]["mlflow"] or {}) if versions else {}

            seen = copy()  # from its first read on: never null (before the syncer: pending)
            assert seen == {} or seen["status"] == "pending"

            wait_for("version 1", lambda: c.get(f"/v1/models/{model}/versions").json())
            assert copy()["status"] == "pending"  # a documented value, not null
            # MLflow's own retries of one call took over two minutes before the first failure
            # could be counted; now each refused call counts at once (the bound: a guard)
            failing = wait_for("a failed attempt, shown", lambda: copy().get("attempts"), 90)
            shown = copy()
            assert shown["status"] == "pending" and failing >= 1
            assert shown["last_error"] and "onnect" in shown["last_error"]  # Connection…
            metrics = c.get("/metrics").text
            assert re.search(r'lethe_mlflow_exports_total\{outcome="failed"\} [1-9]', metrics)
            listed = c.get("/v1/mlflow/copies").json()  # every copy, for the integrations page
            assert listed["configured"] and listed["items"][0]["status"] == "pending"
            version_id = listed["items"][0]["version_id"]
            assert listed["items"][0]["attempts"] >= 1 and listed["items"][0]["next_attempt_at"]
            cells = mlflow_copy_cells(url, cluster.admin_key, version_id)
            assert cells[0] == "pending" and int(cells[1]) >= 1 and "onnect" in cells[2], cells
            mlflow_server.start()
            retried = c.post(f"/v1/mlflow/copies/{version_id}/retry")  # not after its back-off
            assert retried.status_code == 200, retried.text
            done = wait_for("the copy registered", lambda: copy().get("status") == "registered")
            assert done and copy()["version"] == "1"
            again = c.post(f"/v1/mlflow/copies/{version_id}/retry")
            assert again.status_code == 409 and again.json()["error"]["code"] == "not_pending"
            assert c.post("/v1/mlflow/copies/999999/retry").status_code == 404
