"""Erased plaintext leaves memory: `lethe serve` registers a CSV, trains two models
and erases one person; within the plaintext TTL the worker process that held the rows has
given way to a fresh one, and a scan of every Lethe process's memory (/proc/<pid>/mem) finds
none of the erased rows' feature bytes (float32 or float64) and none of their ids or the
subject's. The API process parses no upload itself (app/core/services/isolated.py), zeroes the
bodies it saw and has glibc overwrite what it frees (app/api/scrub.py)."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.integration.test_faults import wait_until
from tests.support.cluster import Cluster
from tests.support.memory_scan import scan
from tests.support.processes import children, worker_processes

N, D, PEOPLE, PERSON = 300, 32, 30, 7


def corpus() -> tuple[bytes, np.ndarray]:
    rng = np.random.default_rng(11)
    X = rng.standard_normal((N, D)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int)
    header = "id,subject," + ",".join(f"f{j}" for j in range(D)) + ",label,split"
    lines = [header] + [
        f"QZXV-{i:04d}-ERASEME,personKQJ{i % PEOPLE:02d},"
        + ",".join(repr(float(v)) for v in X[i])
        + f",{y[i]},{'test' if i < 50 else 'train'}"
        for i in range(N)
    ]
    return "\n".join(lines).encode(), X


def needles(X: np.ndarray) -> dict[str, dict[str, bytes]]:
    """What of the erased rows a scan looks for, by kind."""
    gone = [i for i in range(N) if i % PEOPLE == PERSON]
    return {
        "features": {
            **{f"float32 row {i}": X[i].tobytes() for i in gone},
            **{f"float64 row {i}": X[i].astype(np.float64).tobytes() for i in gone},
        },
        "ids": {
            **{f"id {i}": f"QZXV-{i:04d}-ERASEME".encode() for i in gone},
            **{f"id {i} ucs4": f"QZXV-{i:04d}-ERASEME".encode("utf-32-le") for i in gone},
            "subject": f"personKQJ{PERSON:02d}".encode(),
            "subject ucs4": f"personKQJ{PERSON:02d}".encode("utf-32-le"),
        },
    }


def register_and_train(c: httpx.Client, body: bytes) -> int:
    """The CSV registered and a `retrain` and a `convex_head` model trained on it: its id."""
    dataset = c.post(
        "/v1/datasets",
        files={"file": ("d.csv", io.BytesIO(body))},
        data={"id_column": "id", "subject_column": "subject", "split_column": "split"},
    ).json()["id"]
    for method in ({"name": "retrain"}, {"name": "convex_head", "lam": 1e-2, "R": 20.0}):
        model = c.post(
            "/v1/models",
            json={
                "name": method["name"],
                "dataset_id": dataset,
                "architecture": {"type": "logreg"},
                "method": method,
            },
        ).json()
        wait_until(lambda m=model: c.get(f"/v1/models/{m['id']}").json()["status"] == "ready")
    return int(dataset)


@pytest.mark.integration
@pytest.mark.long
def test_no_process_keeps_an_erased_persons_rows(tmp_path: Path) -> None:
    body, X = corpus()
    cluster = Cluster(tmp_path / "serve", None, None, plaintext_ttl_seconds=4)
    cluster.start_api()
    with cluster, cluster.client() as c:
        assert cluster.api is not None
        api = cluster.api.pid
        # `lethe serve` started again on an allocator that overwrites each freed block
        # (app/core/allocator.py): on a loaded machine the ids stayed in Python's pools without it
        environment = Path(f"/proc/{api}/environ").read_bytes().split(b"\0")
        assert b"PYTHONMALLOC=malloc" in environment, environment
        dataset = register_and_train(c, body)
        (before,) = worker_processes(api)
        answer = c.post(
            "/v1/deletions",
            json={"dataset_id": dataset, "subject_ids": [f"personKQJ{PERSON:02d}"]},
            headers={"Prefer": "wait=60"},
        )
        assert answer.status_code == 200 and answer.json()["status"] == "done", answer.text
        # the worker that held the rows gives way within the TTL: an event, not a sleep
        wait_until(lambda: worker_processes(api) not in ([], [before]), what="a fresh worker")
        wanted = needles(X)
        (fresh,) = worker_processes(api)
        for name, pid in (("api", api), ("worker", fresh)):
            found = scan(pid, wanted["features"])
            assert not +found, (name, +found)
        for name, pid in (("api", api), ("worker", fresh)):
            found = scan(pid, wanted["ids"])
            assert not +found, (name, +found)
        # the successor warms the two sessions its predecessor held, then still works; the
        # convex_head model's anchored state was handed over, not prepared anew (the scans
        # above read the successor, which holds the handed-over bytes from its start)
        warmed = "lethe_sessions_warmed_total 2.0"
        wait_until(lambda: warmed in c.get("/metrics").text, what="the sessions warmed")
        assert "lethe_resident_states_handed_over_total 1.0" in c.get("/metrics").text
        again = c.post(
            "/v1/deletions",
            json={"dataset_id": dataset, "sample_ids": ["QZXV-0001-ERASEME"]},
            headers={"Prefer": "wait=60"},
        )
        assert again.status_code == 200 and again.json()["status"] == "done", again.text


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`."""
    found, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"  # a zombie is gone, waiting for its reaper


@pytest.mark.integration
def cmdline(pid: int) -> bytes:
    """A process's command line, or nothing once it has exited (the pool's worker leaves
    after its one task, maybe between the listing and this read)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def test_an_api_that_dies_leaves_no_fork_server_behind(tmp_path: Path) -> None:
    """The upload pool's fork server and its idle worker outlived a `lethe serve` that was
    killed (each about 110 MB; the suite piled up hundreds): they now leave with the API."""
    body, _ = corpus()
    cluster = Cluster(tmp_path / "serve", None, None)
    cluster.start_api()
    with cluster, cluster.client() as c:
        assert cluster.api is not None
        response = c.post(
            "/v1/datasets",
            files={"file": ("d.csv", io.BytesIO(body))},
            data={"id_column": "id", "subject_column": "subject", "split_column": "split"},
        )
        assert response.status_code == 201, response.text
        below = descendants(cluster.api.pid)
        forked = [p for p in below if b"forkserver" in cmdline(p)]
        assert forked, below  # the fork server and the pool's idle worker
        cluster.api.kill()  # SIGKILL: no lifespan runs, nothing is shut down cleanly
        cluster.api.wait(timeout=30)
        wait_until(lambda: not any(alive(p) for p in below), what="the API's processes gone")


def test_an_api_killed_mid_registration_takes_its_upload_child_with_it(tmp_path: Path) -> None:
    """Killed while a child registers a large upload, the API is not reaped here (a killed
    process's zombie still answers `kill -0`): the child and the fork server leave on its
    death itself, and write nothing more."""
    cluster = Cluster(tmp_path / "serve", None, None)
    cluster.start_api()
    with cluster, cluster.client() as c:
        assert cluster.api is not None
        spec = {"builtin": "synthetic", "n_samples": 1_000_000, "n_features": 32}
        started = c.post("/v1/datasets", json=spec)
        assert started.status_code == 202, started.text
        where = f"/v1/datasets/{started.json()['id']}"
        progress = lambda: c.get(where).json().get("progress") or {}  # noqa: E731
        wait_until(lambda: progress().get("rows_done", 0) > 0, what="rows being written")
        below = descendants(cluster.api.pid)
        cluster.api.kill()  # SIGKILL, and no wait(): its zombie stays until the test ends
        wait_until(lambda: not any(alive(p) for p in below), what="the API's children gone")
        cluster.api.wait(timeout=30)
    with sqlite3.connect(cluster.data_dir / "lethe.db") as db:  # gone on the death: mid-way
        status, done = db.execute("SELECT status, rows_done FROM datasets").fetchone()
    assert status == "registering" and done < spec["n_samples"] // 2, (status, done)
