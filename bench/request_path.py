"""The request path: accepted POST /v1/deletions per second with 16 clients
on one API process, while the worker applies updates, beside a minimal FastAPI + SQLAlchemy
endpoint doing the same inserts and commit (bench/minimal_app.py), on the same load generator
(wrk, a C program, so the client costs the 2 cores little), in the same run. `GET …/weights`
is measured under that load too (2 more connections), plain and conditional (If-None-Match).

    .venv/bin/python -m bench.request_path [--modes embedded,postgres] [--seconds 20]

Embedded: `lethe serve` on a SQLite file with its worker process (`embedded-thread`: the
worker as a thread of the API process, as before issue 28's goal 5); the minimal endpoint on
another SQLite file. Postgres: `lethe serve` + 1 `lethe worker` on a fresh PostgreSQL database
and Redis; the minimal endpoint on another fresh database. Dataset: synthetic 50,000 × 20,
2 classes; model: logreg with method `retrain` (every batch of deletions is a real retrain).
Each side also records its server process's CPU per request served (`/proc/PID/stat`; Lethe's
embedded figure includes its worker process), and Lethe's side the model's versions every second
during the load and for 10 s after it (`versions_timeline`): whether updates complete while
the POSTs arrive. Writes bench/results/request_path.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from app.core.db.migrate import upgrade_to_head
from bench.common import children_cpu_seconds, cpu_seconds, ready, scratch_database, write_result
from tests.support.cluster import Cluster, free_port

REDIS = "redis://127.0.0.1:6379/0"
WRK = Path(__file__).resolve().parent / "wrk"
AFTER_SECONDS = 10.0  # how long versions are still watched once Lethe's load has stopped


def wrk(script: str, url: str, seconds: float, connections: int, env: dict[str, str]) -> dict:
    """Run wrk with one of bench/wrk/*.lua; its `done` hook writes the summary as JSON."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [
                "wrk",
                "-t1",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                "--timeout",
                "30s",
                "-s",
                str(WRK / script),
                url,
            ],
            env={**os.environ, **env, "WRK_OUT": out.name},
            check=True,
            capture_output=True,
        )
        result = json.loads(Path(out.name).read_text())
    result["per_second"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def load(
    url: str,
    post_path: str,
    weights_path: str,
    key: str,
    reader: str,
    dataset_id: int,
    ids_file: Path,
    seconds: float,
    clients: int,
    etag: str,
    server_pid: int,
) -> dict:
    """16 clients POSTing deletions, and alongside 2 GETting weights (plain, then conditional);
    the server process's CPU over the whole load, per request served."""
    post_env = {
        "WRK_IDS": str(ids_file),
        "WRK_DATASET": str(dataset_id),
        "WRK_PATH": post_path,
        "WRK_KEY": key,
    }
    get_env = {"WRK_PATH": weights_path, "WRK_KEY": reader}
    cpu_before = cpu_seconds(server_pid) + children_cpu_seconds(server_pid)
    with cf.ThreadPoolExecutor(2) as pool:
        posts = pool.submit(wrk, "deletions.lua", url, seconds, clients, post_env)
        time.sleep(1.0)
        plain = wrk("get.lua", url, (seconds - 2) / 2, 2, get_env)
        conditional = wrk("get.lua", url, (seconds - 2) / 2, 2, {**get_env, "WRK_ETAG": etag})
        result = {"posts": posts.result(), "weights": plain, "weights_if_none_match": conditional}
    cpu = cpu_seconds(server_pid) + children_cpu_seconds(server_pid) - cpu_before
    served = sum(r["requests"] for r in result.values())
    return {**result, "server_cpu_seconds": cpu, "server_cpu_ms_per_request": 1e3 * cpu / served}


def prepare(cluster: Cluster, n_samples: int, tmp: Path) -> dict:
    """Dataset, a ready retrain model, a requester and a reader key, the ids file, weights."""
    with cluster.client(timeout=600) as c:
        ds = ready(
            c,
            c.post(
                "/v1/datasets",
                json={"builtin": "synthetic", "n_samples": n_samples, "n_features": 20},
            ),
        )
        model = c.post(
            "/v1/models",
            json={"name": "bench", "dataset_id": ds["id"], "architecture": {"type": "logreg"}},
        ).json()
        while (status := c.get(f"/v1/models/{model['id']}").json()["status"]) != "ready":
            if status == "failed":
                raise RuntimeError("training failed")
            time.sleep(0.5)
        ids: list[str] = []
        while True:
            page = c.get(
                f"/v1/datasets/{ds['id']}/samples",
                params={"split": "train", "limit": 1000, "offset": len(ids)},
            ).json()["items"]
            if not page:
                break
            ids += [s["external_id"] for s in page]
        weights = c.get(f"/v1/models/{model['id']}/weights")
    ids_file = tmp / "ids.txt"
    ids_file.write_text("\n".join(ids) + "\n")
    return {
        "dataset_id": ds["id"],
        "model_id": model["id"],
        "ids": ids,
        "ids_file": ids_file,
        "weights": weights.content,
        "etag": weights.headers["etag"],
        "requester": cluster.new_key("requester"),
        "reader": cluster.new_key("reader"),
    }


def versions(cluster: Cluster, model_id: int) -> int:
    with cluster.client() as c:
        return len(c.get(f"/v1/models/{model_id}/versions").json())


@contextlib.contextmanager
def version_timeline(cluster: Cluster, model_id: int, every: float = 1.0) -> Iterator[list]:
    """[seconds since start, versions] sampled every `every` s while the block runs: whether
    updates complete during the load, or only once it stops."""
    timeline: list[list[float]] = []
    stop = threading.Event()

    def watch() -> None:
        start = time.monotonic()
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                timeline.append([round(time.monotonic() - start, 1), versions(cluster, model_id)])
            stop.wait(every)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield timeline
    finally:
        stop.set()
        watcher.join(timeout=10)


BURN = (
    "import torch\n"
    "torch.set_num_threads(1)\n"
    "a = torch.randn(384, 384)\n"
    "while True:\n"
    "    a = torch.tanh(a @ a)\n"
)


@contextlib.contextmanager
def background_work() -> Iterator[None]:
    """One core of CPU work beside the minimal endpoint, as Lethe's worker (one torch thread,
    LETHE_TORCH_THREADS=1) is beside Lethe's API (issue 28: the same background for both)."""
    proc = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        time.sleep(1.0)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def minimal_server(url: str, env_extra: dict[str, str], log: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.minimal_app:app",
                "--port",
                str(port),
                "--log-level",
                "info",
            ],
            env={**os.environ, "MINIMAL_DATABASE_URL": url, **env_extra},
            stdout=fh,
            stderr=fh,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/docs", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield base, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_mode(mode: str, seconds: float, clients: int, n_samples: int) -> dict:
    from bench.minimal_app import seed

    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        embedded = mode.startswith("embedded")
        if embedded:
            lethe_url, redis = None, None
            minimal_url = f"sqlite:///{tmp / 'minimal.db'}"
        else:
            lethe_url = stack.enter_context(scratch_database(migrate=False))
            minimal_url = stack.enter_context(scratch_database(migrate=False))
            redis = REDIS
            upgrade_to_head(lethe_url)
        lethe_side = stack.enter_context(contextlib.ExitStack())
        worker = "thread" if mode == "embedded-thread" else "process"
        cluster = lethe_side.enter_context(
            Cluster(tmp / "lethe", lethe_url, redis, torch_threads=1, embedded_worker=worker)
        )
        base = cluster.start_api()
        assert cluster.api is not None
        if not embedded:
            cluster.start_worker()
        p = prepare(cluster, n_samples, tmp)
        before = versions(cluster, p["model_id"])
        with version_timeline(cluster, p["model_id"]) as timeline:
            lethe = load(
                base,
                "/v1/deletions",
                f"/v1/models/{p['model_id']}/weights",
                p["requester"],
                p["reader"],
                p["dataset_id"],
                p["ids_file"],
                seconds,
                clients,
                p["etag"],
                cluster.api.pid,
            )
            lethe["new_versions_during_load"] = versions(cluster, p["model_id"]) - before
            time.sleep(AFTER_SECONDS)  # the backlog's first updates, once the load stopped
        lethe["versions_timeline"] = timeline
        during = lethe["new_versions_during_load"]
        last = timeline[-1][1] if timeline else before + during
        lethe["new_versions_after_load"] = last - before - during
        # Lethe stops before the minimal endpoint's turn: its worker would still be applying
        # the load's backlog, CPU work on top of the background work the minimal side is given
        lethe_side.close()
        seed(minimal_url, p["ids"], p["weights"])
        with (
            background_work(),
            minimal_server(minimal_url, {}, tmp / "minimal.log") as (mbase, mpid),
        ):
            with httpx.Client() as hc:
                metag = hc.get(f"{mbase}/weights").headers["etag"]
            minimal = load(
                mbase,
                "/deletions",
                "/weights",
                "unused",
                "unused",
                1,
                p["ids_file"],
                seconds,
                clients,
                metag,
                mpid,
            )
        return {
            "lethe": lethe,
            "minimal": minimal,
            "weights_bytes": len(p["weights"]),
            "throughput_ratio": lethe["posts"]["per_second"] / minimal["posts"]["per_second"],
            "p99_ratio": lethe["posts"]["p99_ms"] / minimal["posts"]["p99_ms"],
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="embedded,postgres", help="also: embedded-thread")
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--out", default="request_path")
    args = parser.parse_args()
    results: dict = {
        "setup": f"synthetic {args.samples} x 20, logreg, method retrain; wrk -t1 "
        f"-c{args.clients} for {args.seconds}s POSTing single-sample deletions; 2 more "
        "connections GET the weights (plain for half the time, then If-None-Match)",
        "load_average_before": os.getloadavg(),
    }
    for mode in args.modes.split(","):
        results[mode] = run_mode(mode, args.seconds, args.clients, args.samples)
        r = results[mode]
        for who in ("lethe", "minimal"):
            posts, w = r[who]["posts"], r[who]["weights"]
            wc = r[who]["weights_if_none_match"]
            print(
                f"{mode:9} {who:8} POST {posts['per_second']:7.1f}/s p50 {posts['p50_ms']:7.1f} "
                f"p99 {posts['p99_ms']:7.1f} ms (non-2xx {posts['non_2xx']}) | weights p50 "
                f"{w['p50_ms']:.1f} p99 {w['p99_ms']:.1f} ms | 304 p50 {wc['p50_ms']:.1f} "
                f"p99 {wc['p99_ms']:.1f} ms | server CPU "
                f"{r[who]['server_cpu_ms_per_request']:.2f} ms/request",
                flush=True,
            )
        print(f"{mode:9} ratio {r['throughput_ratio']:.2f}x, p99 ratio {r['p99_ratio']:.2f}")
        print(
            f"{mode:9} model versions committed during the load: "
            f"{r['lethe']['new_versions_during_load']}, in the {AFTER_SECONDS:.0f} s after it: "
            f"{r['lethe']['new_versions_after_load']}"
        )
    path = write_result(args.out, results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
