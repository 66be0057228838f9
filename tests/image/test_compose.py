"""The distributed deployment from one command: `scripts/compose-up` builds
the images from Debian's packages, brings PostgreSQL, Redis, SeaweedFS, the witness, the API and
two workers up with podman-compose, each healthy; the README's walkthrough runs against it; a
worker killed with SIGKILL mid-flight loses nothing: the next deletion is still certified.
Marked `image` (make test-image, CI): minutes of builds, kept out of `make test`."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.test_walkthrough import run_walkthrough
from tests.support.cluster import free_port

# The item's budget covers its module fixture, which builds both images (a fresh machine: minutes,
# up to compose-up's own 1,800 s), then the test's own waits (300 s training, 300 s deletion,
# 120 s restarts): the suite-wide 300 s stopped CI's run mid-wait once, the work still going.
pytestmark = [pytest.mark.image, pytest.mark.timeout(2700)]
ROOT = Path(__file__).resolve().parents[2]
COMPOSE = str(Path(sys.executable).parent / "podman-compose")  # the test extra's


def sh(*args: str, env: dict[str, str], timeout: float = 120) -> str:
    done = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, dict]]:
    """A fresh project (its own name, port and secrets file), torn down with its volumes."""
    assert shutil.which("podman"), "make test-image installs podman"
    project = f"lethetest{uuid.uuid4().hex[:6]}"
    env_file = ROOT / "deploy" / "lethe.env"
    kept = env_file.read_bytes() if env_file.exists() else None
    env_file.unlink(missing_ok=True)
    port = free_port()
    env = {
        **os.environ,
        "LETHE_COMPOSE_PROJECT": project,
        "LETHE_PORT": str(port),
        "PODMAN_COMPOSE": COMPOSE,
    }
    started = time.monotonic()
    try:
        up = subprocess.run(
            [str(ROOT / "scripts" / "compose-up"), "--workers", "2"],
            capture_output=True, text=True, timeout=1800, env=env, cwd=ROOT,
        )  # fmt: skip
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        keys = re.findall(r"lethe_adm_[A-Za-z0-9_-]+", up.stdout)
        assert keys, up.stdout
        print(f"compose-up (builds included): {time.monotonic() - started:.0f} s", flush=True)
        yield f"http://127.0.0.1:{port}", keys[0], env
    finally:
        subprocess.run(
            [str(ROOT / "scripts" / "compose-down"), "--volumes"],
            capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
        )  # fmt: skip
        env_file.unlink(missing_ok=True)
        if kept is not None:
            env_file.write_bytes(kept)


def containers(env: dict[str, str], service: str) -> list[str]:
    out = sh(
        "podman", "ps", "-q",
        "--filter", f"label=com.docker.compose.project={env['LETHE_COMPOSE_PROJECT']}",
        "--filter", f"label=com.docker.compose.service={service}",
        env=env,
    )  # fmt: skip
    return out.split()


def test_compose_up_brings_every_service_up_healthy_and_a_killed_worker_loses_nothing(
    deployment: tuple[str, str, dict], tmp_path: Path
) -> None:
    url, key, env = deployment
    began = time.monotonic()

    def mark(step: str) -> None:  # where the item's time went, shown if it fails
        print(f"{step}: {time.monotonic() - began:.0f} s into the test", flush=True)

    for service, count in (("postgres", 1), ("redis", 1), ("s3", 1), ("witness", 1),
                           ("api", 1), ("worker", 2)):  # fmt: skip
        found = containers(env, service)
        assert len(found) == count, (service, found)
        for cid in found:  # each container's own healthcheck, as an orchestrator runs it
            sh("podman", "healthcheck", "run", cid, env=env)

    result = run_walkthrough(tmp_path / "work", url, key)
    assert '"status": "done"' in result.stdout and '"ok": true' in result.stdout
    mark("walkthrough done")

    admin = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=url, headers=admin, timeout=60) as c:
        dataset = c.post("/v1/datasets", json={"builtin": "digits"}).json()["id"]
        model = c.post(
            "/v1/models",
            json={"name": "compose", "dataset_id": dataset, "training": {"epochs": 2}},
        ).json()["id"]
        deadline = time.monotonic() + 300
        while c.get(f"/v1/models/{model}").json()["status"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(1)
        mark("model ready")
        ids = [
            s["external_id"]
            for s in c.get(
                f"/v1/datasets/{dataset}/samples", params={"split": "train", "limit": 2}
            ).json()["items"]
        ]
        workers = containers(env, "worker")
        assert len(workers) == 2, workers
        for victim in workers:  # both workers crash at once (SIGKILL to the container's
            # process from the host: `podman kill` would count as a stop), before the request:
            # a digits deletion applied before the kill would test nothing
            pid = int(sh("podman", "inspect", "-f", "{{.State.Pid}}", victim, env=env))
            os.kill(pid, signal.SIGKILL)
        filed = c.post("/v1/deletions", json={"dataset_id": dataset, "sample_ids": ids[:1]})
        assert filed.status_code in (200, 202), filed.text
        request = filed.json()["id"]
        # restart: unless-stopped brings them back; the request, durable before its 202,
        # is picked up and applied once
        deadline = time.monotonic() + 300
        while (done := c.get(f"/v1/deletions/{request}", params={"wait": 20}).json())[
            "status"
        ] not in ("done", "failed"):
            assert time.monotonic() < deadline, done
        assert done["status"] == "done" and len(done["certificate_ids"]) == 1, done
        mark("deletion certified after both workers' SIGKILL")
        assert c.get("/v1/audit/verify").json()["ok"] is True
    deadline = time.monotonic() + 120
    while True:  # both came back (the restart is podman's, after each one's cleanup)
        states = [
            sh("podman", "inspect", "-f", "{{.State.Status}} {{.RestartCount}}", w, env=env)
            for w in workers
        ]
        if all(st.split()[0] == "running" and int(st.split()[1]) >= 1 for st in states):
            break
        assert time.monotonic() < deadline, states
        time.sleep(1)
    # A worker stopped while it starts again (importing torch, reconciling) exits on SIGTERM
    # itself; as the container's PID 1 with no handler yet it ignored it, and the engine
    # killed it at the end of its grace period (exit 137).
    sh("podman", "stop", "--time", "120", workers[0], env=env, timeout=180)
    code = sh("podman", "inspect", "-f", "{{.State.ExitCode}}", workers[0], env=env).strip()
    if code != "0":
        log = subprocess.run(["podman", "logs", "--tail", "60", workers[0]], capture_output=True,
                             text=True, env=env).stdout  # fmt: skip
        raise AssertionError(f"the worker did not stop on SIGTERM (exit {code}):\n{log}")
