"""End to end over real processes: `lethe serve` (uvicorn, embedded SQLite) driven by
`lethe demo` and httpx; and the distributed mode with a real `lethe worker` on
PostgreSQL + Redis."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from redis import Redis

from app.core.settings import Settings
from app.main import create_app
from tests.conftest import SMALL_TRAINING, Api, make_keys, truncate_all
from tests.support.cluster import Cluster, free_port

pytestmark = pytest.mark.integration

LETHE = [sys.executable, "-m", "app.launch"]


def wait_for_key(proc: subprocess.Popen, log: Path, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text()
        match = re.search(r"lethe_adm_[A-Za-z0-9_-]+", text)
        if match and "Application startup complete" in text:
            return match.group(0)
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {text}")
        time.sleep(0.1)
    raise AssertionError(f"server did not start: {log.read_text()}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with Cluster(tmp_path / "data", None, None) as cluster:
        yield cluster.start_api(), cluster.admin_key


def test_embedded_server_full_story(server: tuple[str, str], tmp_path: Path) -> None:
    url, key = server
    assert (tmp_path / "data" / "lethe.db").exists()  # the embedded default: a SQLite file
    demo = subprocess.run(
        [*LETHE, "demo", "--epochs", "5"],
        capture_output=True,
        text=True,
        env={**os.environ, "LETHE_URL": url, "LETHE_API_KEY": key, "COLUMNS": "200"},
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    assert "sha256 ok: True" in out and "guarantee=exact" in out
    assert "410 weights_erased" in out and "erased samples in the dataset: 3" in out

    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=headers) as c:
        model = c.get("/v1/models/1").json()
        assert model["current_version"]["number"] == 2 and model["n_train"] == 1434
        certs = c.get("/v1/audit/certificates").json()["items"]
        assert len(certs) == 1 and certs[0]["epsilon"] == 0.0 and certs[0]["delta"] == 0.0
        assert c.get("/v1/audit/verify").json()["ok"] is True
        assert c.get("/v1/models/1/versions/1/weights").status_code == 410
        assert c.get("/v1/models", headers={"Authorization": "Bearer x"}).status_code == 401
        assert "lethe_http_requests_total" in c.get("/metrics").text


@pytest.mark.long
def test_restart_keeps_state_and_does_not_print_a_new_key(tmp_path: Path) -> None:
    env = {**os.environ, "LETHE_DATA_DIR": str(tmp_path / "data")}
    env.pop("LETHE_EMBEDDED_WORKER", None)  # the default: a worker process
    keys = []
    for _ in range(2):
        port, log = free_port(), tmp_path / f"serve-{len(keys)}.log"
        with log.open("w") as fh:
            proc = subprocess.Popen(
                [*LETHE, "serve", "--port", str(port)], stdout=fh, stderr=fh, env=env
            )
        try:
            if not keys:
                keys.append(wait_for_key(proc, log))
            else:
                deadline = time.monotonic() + 60
                while "Application startup complete" not in log.read_text():
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.1)
                assert "lethe_adm_" not in log.read_text()
                r = httpx.get(
                    f"http://127.0.0.1:{port}/v1/models",
                    headers={"Authorization": f"Bearer {keys[0]}"},
                )
                assert r.status_code == 200
                keys.append("checked")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture
def distributed(pg_url: str, redis_url: str, tmp_path: Path) -> Iterator[Api]:
    """API on PostgreSQL with the RQ dispatcher, and a real `lethe worker` process."""
    truncate_all(pg_url)
    queue = f"lethe-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(
        data_dir=tmp_path,
        database_url=pg_url,
        redis_url=redis_url,
        queue_name=queue,
        bootstrap_admin_key=False,
        reconcile_seconds=1.0,
        heartbeat_seconds=1.0,
    )
    env = {
        **os.environ,
        "LETHE_DATABASE_URL": pg_url,
        "LETHE_DATA_DIR": str(tmp_path),  # the same master key file as the API
        "LETHE_redis_url": redis_url,
        "LETHE_QUEUE_NAME": queue,
        "LETHE_RECONCILE_SECONDS": "1",
        "LETHE_HEARTBEAT_SECONDS": "1",
    }
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [*LETHE, "worker"], stdout=log, stderr=log, env=env, start_new_session=True
    )
    try:
        with TestClient(create_app(settings)) as client:
            yield Api(client=client, url=pg_url, keys=make_keys(pg_url))
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)  # RQ's forked scheduler, if still there
        log.close()
        Redis.from_url(redis_url).delete(f"rq:queue:{queue}")


def test_distributed_worker_consumes_jobs_from_redis(distributed: Api) -> None:
    api = distributed
    checks = api.client.get("/readyz").json()["checks"]
    assert checks == {"database": True, "queue": True, "restore": True}
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    model = api.post(
        "/v1/models", json={"name": "rq", "dataset_id": ds["id"], "training": SMALL_TRAINING}
    ).json()
    model = api.wait(f"/v1/models/{model['id']}", ("ready", "failed"), timeout=180)
    assert model["status"] == "ready", model
    ids = [
        s["external_id"]
        for s in api.get(
            f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": 4}
        ).json()["items"]
    ]
    req = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": ds["id"], "sample_ids": ids}
    ).json()
    done = api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"), timeout=180)
    assert done["status"] == "done" and done["models"][0]["version"] == 2
    assert "lethe_worker_heartbeat_timestamp_seconds{" in api.get("/metrics").text
    assert api.get("/v1/audit/verify", role="auditor").json()["ok"]


def test_signal_lost_in_redis_is_reconciled(distributed: Api) -> None:
    """A model whose training signal never reached Redis is picked up by the reconciler."""
    api = distributed
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    api.client.app.state.dispatcher.enqueue = lambda *a: None  # the signal is lost
    model = api.post(
        "/v1/models", json={"name": "lost", "dataset_id": ds["id"], "training": SMALL_TRAINING}
    ).json()
    model = api.wait(f"/v1/models/{model['id']}", ("ready", "failed"), timeout=180)
    assert model["status"] == "ready"
