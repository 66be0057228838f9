"""The embedded worker as a process of its own: `lethe serve`'s default.

The dispatcher's side is driven directly with a test job run in the real child process
(wake-ups reach the API process; a dead child is replaced and its signal sent again; stop
ends it); the whole service is driven through a real `lethe serve`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from app.core import worker_process
from app.core.db.session import database
from app.core.db.tables import Model
from app.core.settings import Settings
from app.core.wakeups import FINISHED, wait
from app.core.worker_process import ProcessDispatcher
from tests.integration.test_faults import wait_until
from tests.support.cluster import LETHE, Cluster, free_port
from tests.support.processes import worker_processes

MARK = "LETHE_TEST_WORKER_MARK"


def mark_and_wake(ctx: object, n: int) -> None:
    """A job for the child (its JobContext first): note what ran where, then wake the API's
    long polls."""
    with Path(os.environ[MARK]).open("a") as fh:
        fh.write(f"{n} {os.getpid()}\n")
    FINISHED.wake()


def marks(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]  # type: ignore[misc]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_the_child_runs_jobs_wakes_the_api_and_is_replaced_when_it_dies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "marks"
    monkeypatch.setenv(MARK, str(path))  # the spawned child inherits the environment
    dispatcher = ProcessDispatcher(Settings(data_dir=tmp_path, redis_url=None))
    dispatcher.start()
    try:
        first = dispatcher.pid
        assert first is not None and first != os.getpid() and dispatcher.ping()

        async def run_and_wait(n: int) -> bool:
            woken = FINISHED.register()
            dispatcher.enqueue(f"{__name__}.mark_and_wake", n)
            await wait(woken, 60)
            return woken.done()

        assert asyncio.run(run_and_wait(1))  # woken over the pipe, not by a timeout
        assert marks(path) == [(1, first)]
        wait_until(lambda: dispatcher.depth() == 0, what="the child took the signal")

        os.kill(first, signal.SIGKILL)
        wait_until(lambda: dispatcher.starts == 2 and dispatcher.pid != first, what="restart")
        assert asyncio.run(run_and_wait(2))
        second = dispatcher.pid
        assert second is not None and alive(second) and not alive(first)
        assert marks(path) == [(1, first), (2, second)]
        assert b"lethe_job_duration_seconds" in dispatcher.metrics()

        os.kill(second, signal.SIGKILL)
        wait_until(lambda: not dispatcher.ping(), what="the second child is gone")
        dispatcher.enqueue(f"{__name__}.mark_and_wake", 3)  # lost with the pipe, kept pending
        wait_until(lambda: len(marks(path)) == 3, what="the next child ran the signal")
        third = dispatcher.pid
        assert marks(path)[2] == (3, third) and third not in (first, second, os.getpid())
    finally:
        dispatcher.stop()
    assert not dispatcher.ping() and third is not None and not alive(third)


def test_ctrl_c_reaches_the_child_and_leaves_it_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A terminal's Ctrl-C is SIGINT to the whole process group: the child, still importing
    torch, printed a KeyboardInterrupt traceback and died, and the API started another while
    it shut down. The child ignores SIGINT from its first line: the same child runs the
    next job."""
    path = tmp_path / "marks"
    monkeypatch.setenv(MARK, str(path))
    dispatcher = ProcessDispatcher(Settings(data_dir=tmp_path, redis_url=None))
    dispatcher.start()
    try:
        child = dispatcher.pid
        assert child is not None
        os.kill(child, signal.SIGINT)  # at once: while it imports
        dispatcher.enqueue(f"{__name__}.mark_and_wake", 1)
        # the cap only ends a hang: a child importing torch and this module took over 60 s
        # beside a whole suite on two cores
        wait_until(lambda: len(marks(path)) == 1, timeout=300, what="the child ran the job")
        assert marks(path) == [(1, child)] and dispatcher.starts == 1
    finally:
        dispatcher.stop()


def still_starting(*_: object) -> None:
    """A child that never gets to listen (as one still importing torch): it says so, waits."""
    Path(os.environ[MARK]).write_text(str(os.getpid()))
    time.sleep(600)


def test_a_child_still_starting_is_stopped_at_once_not_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server stopped right after its start: its worker had not yet read the pipe's "stop"
    (it reads it once started), so the dispatcher waited STOP_SECONDS (30 s), killed it and
    logged so, and `lethe serve` took more than 30 s to exit on a busy machine (6-8 s on a
    quiet one). SIGTERM ends a starting child at once; it holds no job yet."""
    path = tmp_path / "started"
    monkeypatch.setenv(MARK, str(path))
    monkeypatch.setattr(worker_process, "CHILD", f"{__name__}.still_starting")
    dispatcher = ProcessDispatcher(Settings(data_dir=tmp_path, redis_url=None))
    dispatcher.start()
    wait_until(path.exists, what="the child runs")
    child = dispatcher.pid
    assert child is not None and int(path.read_text()) == child
    with caplog.at_level("WARNING", logger="lethe.dispatch"):
        dispatcher.stop()
    assert not alive(child) and not dispatcher.ping()
    assert "did not stop" not in caplog.text  # ended by SIGTERM, not killed after the grace


@pytest.mark.integration
@pytest.mark.long
def test_lethe_serve_updates_in_its_worker_process_and_takes_it_down_with_it(
    tmp_path: Path,
) -> None:
    cluster = Cluster(tmp_path / "serve", None, None, reconcile_seconds=0.5)
    cluster.start_api()
    with cluster, cluster.client() as c:
        assert cluster.api is not None
        api_pid = cluster.api.pid
        ds = c.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
        body = {"name": "m", "dataset_id": ds["id"], "architecture": {"type": "logreg"}}
        model = c.post("/v1/models", json=body).json()
        wait_until(lambda: c.get(f"/v1/models/{model['id']}").json()["status"] == "ready")
        page = c.get(f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": 2})
        ids = [s["external_id"] for s in page.json()["items"]]

        answer = c.post(
            "/v1/deletions",
            json={"dataset_id": ds["id"], "sample_ids": ids[:1]},
            headers={"Prefer": "wait=60"},
        )
        assert answer.status_code == 200 and answer.json()["status"] == "done", answer.text
        children = worker_processes(api_pid)
        assert len(children) == 1
        worker = children[0]
        # the API process never imports the workers' counters: these are the child's. The
        # job counts its deletions as it ends, after it woke this answer (and compacted)
        counted = 'lethe_deletions_processed_total{method="retrain"} 1.0'
        wait_until(lambda: counted in c.get("/metrics").text, timeout=300, what="the count")
        text = c.get("/metrics").text
        assert counted in text
        assert text.count("# TYPE lethe_job_duration_seconds histogram") == 1

        os.kill(worker, signal.SIGKILL)  # the API starts another and the next request runs
        second = c.post(
            "/v1/deletions",
            json={"dataset_id": ds["id"], "sample_ids": ids[1:2]},
            headers={"Prefer": "wait=60"},
        )
        # the replacement worker imports torch before it takes the job: on a busy machine
        # that outlasts the 60 s the answer waits, so wait for the request itself
        assert second.status_code in (200, 202), second.text
        path = f"/v1/deletions/{second.json()['id']}"
        finished = ("done", "failed")
        wait_until(lambda: c.get(path).json()["status"] in finished, timeout=600, what="it ran")
        assert c.get(path).json()["status"] == "done", c.get(path).text
        assert c.get("/readyz").status_code == 200

        replacement = worker_processes(api_pid)
        assert len(replacement) == 1 and replacement[0] != worker
        cluster.api.kill()  # kill -9 of the API: its worker must not outlive it
        cluster.api.wait(10)
        wait_until(lambda: not alive(replacement[0]), timeout=10, what="the worker died too")


def long_training(c: httpx.Client) -> dict:
    """A 1,000-epoch MLP on digits, once its first epoch is done (it runs for minutes)."""
    ds = c.post("/v1/datasets", json={"builtin": "digits"}).json()
    body = {
        "name": "long",
        "dataset_id": ds["id"],
        "architecture": {"type": "mlp", "hidden": [64]},
        "training": {"epochs": 1000, "batch_size": 32},
    }
    model = c.post("/v1/models", json=body).json()
    wait_until(
        lambda: (c.get(f"/v1/models/{model['id']}").json()["progress"]["epoch"] or 0) >= 1,
        every=0.05,
        what="the long training started",
    )
    return model


@pytest.mark.integration
def test_sigterm_stops_training_in_the_worker_process_and_puts_the_model_back(
    tmp_path: Path,
) -> None:
    """With the worker a process: SIGTERM to `lethe serve` stops the child's
    training between epochs, puts the model back to `queued` and exits cleanly."""
    cluster = Cluster(tmp_path / "serve", None, None)
    cluster.start_api()
    with cluster, cluster.client() as c:
        assert cluster.api is not None
        model = long_training(c)
        started = time.monotonic()
        cluster.api.send_signal(signal.SIGTERM)
        assert cluster.api.wait(60) == 0  # a clean stop, not killed by its own signal
        assert time.monotonic() - started < 30
        assert "Application shutdown complete" in (tmp_path / "serve" / "api.log").read_text()
        # both processes closed their connections: the last one checkpointed and removed the
        # WAL (issue 53: an 8 KB lethe.db-wal remained), before this test opens the file again
        assert not (tmp_path / "serve" / "lethe.db-wal").exists()
        url = f"sqlite:///{tmp_path / 'serve' / 'lethe.db'}"
        with database(url).read() as session:
            status = session.scalar(select(Model.status).where(Model.id == model["id"]))
        assert status == "queued"  # the next start resumes it (tests/service/test_probing.py)


@pytest.mark.integration
def test_a_deletion_is_not_queued_behind_a_long_training(tmp_path: Path) -> None:
    """while the worker process trains a long model, a deletion on
    another dataset's model certifies (the training runs it at its next epoch's check), and
    the training is still running when the deletion is done. First in first out, the
    deletion waited for all 1,000 epochs."""
    cluster = Cluster(tmp_path / "serve", None, None, reconcile_seconds=0.5)
    cluster.start_api()
    with cluster, cluster.client() as c:
        small = c.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
        body = {"name": "quick", "dataset_id": small["id"], "architecture": {"type": "logreg"}}
        quick = c.post("/v1/models", json=body).json()
        wait_until(lambda: c.get(f"/v1/models/{quick['id']}").json()["status"] == "ready")
        slow = long_training(c)
        page = c.get(f"/v1/datasets/{small['id']}/samples", params={"split": "train", "limit": 1})
        answer = c.post(
            "/v1/deletions",
            json={
                "dataset_id": small["id"],
                "sample_ids": [page.json()["items"][0]["external_id"]],
            },
            headers={"Prefer": "wait=30"},
        )
        deletion = answer.json()
        wait_until(
            lambda: c.get(f"/v1/deletions/{deletion['id']}").json()["status"] == "done",
            timeout=120,
            what="the deletion",
        )
        training = c.get(f"/v1/models/{slow['id']}").json()
        assert training["status"] == "training", training  # it waited; the deletion did not
        assert training["progress"]["epoch"] < 1000


@pytest.mark.integration
def test_a_second_ctrl_c_does_not_skip_the_servers_own_shutdown(tmp_path: Path) -> None:
    """An impatient second Ctrl-C was uvicorn's "force quit": the app's shutdown was
    skipped (its worker was started again while the server exited, a KeyboardInterrupt
    traceback printed). It is noted and the stop goes on: exit 0, the worker stopped."""
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env["LETHE_DATA_DIR"] = str(tmp_path / "data")
    with log.open("w") as out:
        server = subprocess.Popen(
            [*LETHE, "serve", "--port", str(free_port())],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(lambda: "startup complete" in log.read_text(), what="the server started")
        os.killpg(server.pid, signal.SIGINT)
        wait_until(lambda: "Shutting down" in log.read_text(), what="the server stops")
        os.killpg(server.pid, signal.SIGINT)  # again, while it stops
        assert server.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
    said = log.read_text()
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert "starting another" not in said, said
    assert "stopping already" in said or "Finished server process" in said, said


@pytest.mark.integration
def test_ctrl_c_stops_lethe_serve_without_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C in a terminal is SIGINT to `lethe serve`'s whole process group, its worker and
    its upload parsers' fork server included: each of those printed a KeyboardInterrupt
    traceback while importing. Now the server alone takes it, stops them, and exits 0."""
    log = tmp_path / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env["LETHE_DATA_DIR"] = str(tmp_path / "data")
    with log.open("w") as out:
        server = subprocess.Popen(
            [*LETHE, "serve", "--port", str(free_port())],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    try:
        wait_until(lambda: "startup complete" in log.read_text(), what="the server started")
        os.killpg(server.pid, signal.SIGINT)  # at once: its children are still importing
        assert server.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
    said = log.read_text()
    assert "Traceback" not in said and "KeyboardInterrupt" not in said, said
    assert "starting another" not in said  # no worker restarted while it stopped
