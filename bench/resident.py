"""Resident model sessions (issue 28, goal 3): POST→certificate against the update's own
compute, with the worker keeping each model's retained rows and noise-free state between
updates (LETHE_RESIDENT_MODELS=2, the default) and without (=0), side by side in one run.

For each n and each setting: a fresh embedded `lethe serve` (SQLite, inline worker, one torch
thread) — or, with `mode="distributed"`, `lethe serve` and one `lethe worker` process on a
fresh PostgreSQL database and the local Redis (`deployment`) — the builtin synthetic dataset
(n samples, `--features` features, 2 classes), one model per method, then `--deletions`
sequential single-sample deletions per model. Per deletion: POST→certificate as the client
sees it (one POST with `Prefer: wait`, a long poll), the update's own compute
(`unlearn_seconds`, the method's maths as the worker timed it), and `rows_loaded` (training
rows the update read from the database: 0 when the session was warm). The summary is the
median over the deletions of POST→certificate, of compute, and of their difference (the
plumbing), per n, method and setting; and the CPU milliseconds per deletion of the API, the
worker processes, PostgreSQL and Redis (`cpu_ms_per_deletion`, from /proc, less what the same
processes spend idle for as long): wall time on a shared 2-core machine moves by tens of
percent from run to run, CPU time much less.

    .venv/bin/python -m bench.resident [--sizes 10000,100000] [--deletions 4]
        [--methods output_perturbation,convex_head,sharded_retrain,recollection]
        [--recollection-max 100000]

Writes bench/results/resident.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from app.client import Client
from app.states import FINISHED_REQUEST
from bench.cluster import Cluster
from bench.common import (
    REDIS,
    children_cpu_seconds,
    cpu_seconds,
    ready,
    scratch_database,
    write_result,
)

MODES = ("embedded", "distributed")
# the embedded worker as a thread of the API process, as before issue 28's goal 5 (not a default)
EMBEDDED_THREAD = "embedded-thread"

TRAINING = {"epochs": 2, "batch_size": 256, "learning_rate": 0.1, "seed": 0}
METHODS: dict[str, dict[str, Any]] = {
    "output_perturbation": {
        "method": {"name": "output_perturbation", "C0": 1.0, "finetune_epochs": 0}
    },
    "convex_head": {
        "architecture": {"type": "logreg", "feature_norm": 20.0},
        "method": {"name": "convex_head", "lam": 1e-3, "R": 20.0, "beta": 1e-3},
    },
    "sharded_retrain": {"method": {"name": "sharded_retrain", "shards": 16, "slices": 4}},
    "recollection": {"method": {"name": "recollection", "max_relative_noise": None}},
}


def trained_model(
    c: Client, method: str, n: int, samples: int, features: int = 20
) -> tuple[int, int, list[str]]:
    """A synthetic dataset (n × `features`, 2 classes) of its own and a logreg model under
    `method` trained on it; returns the dataset's id, the model's id and the external ids of
    its first `samples` training samples."""
    body = {"builtin": "synthetic", "n_samples": n, "n_features": features, "n_classes": 2}
    ds = ready(c, c.post("/v1/datasets", json=body))
    spec = {"name": method, "dataset_id": ds["id"], "training": TRAINING,
            "architecture": {"type": "logreg"}, **METHODS[method]}  # fmt: skip
    model = c.wait_model(c.create_model(spec).id)
    assert model.status == "ready", model.error
    page = c.samples(ds["id"], split="train", limit=samples)
    return ds["id"], model.id, [s.external_id or "" for s in page.items]


def deletion(c: Client, dataset_id: int, model_id: int, sample: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    done = c.delete(dataset_id, [sample], wait=20)  # one round trip (`Prefer: wait`)
    if done.status not in FINISHED_REQUEST:
        done = c.wait_deletion(done.id)
    seconds = time.perf_counter() - t0
    assert done.status == "done", done
    version = c.model(model_id).current_version
    assert version is not None
    m = version.metrics
    compute = float(m.get("unlearn_seconds") or 0.0)  # type: ignore[arg-type]
    return {
        "post_to_certificate_s": seconds,
        "compute_s": compute,
        "plumbing_s": seconds - compute,
        "rows_loaded": m.get("rows_loaded"),
        "method": m.get("method"),
    }


@contextmanager
def deployment(
    data_dir: Path, mode: str, resident: int, device: str = "cpu"
) -> Iterator[tuple[Client, Cluster]]:
    """A started service and an admin client: embedded (SQLite, the worker a child process
    of the API; `embedded-thread`: a thread of it), or distributed (PostgreSQL, Redis, one
    `lethe worker` process holding the sessions); its worker computing on `device`."""
    settings: dict[str, object] = {
        "torch_threads": 1,
        "resident_models": resident,
        "device": device,
    }
    if mode in ("embedded", EMBEDDED_THREAD):
        worker = "thread" if mode == EMBEDDED_THREAD else "process"
        with Cluster(data_dir, None, None, embedded_worker=worker, **settings) as cluster:
            yield Client(cluster.start_api(), cluster.admin_key, timeout=3600), cluster
        return
    with scratch_database() as url, Cluster(data_dir, url, REDIS, **settings) as cluster:
        api = cluster.start_api()
        cluster.start_worker()
        yield Client(api, cluster.admin_key, timeout=3600), cluster


IDLE_SECONDS = 1.5


def server_cpu(name: str) -> float:
    """CPU seconds of every process whose command line holds `name` (PostgreSQL's backends
    and background processes, Redis)."""
    found = subprocess.run(["pgrep", "-f", name], capture_output=True, text=True).stdout
    total = 0.0
    for pid in found.split():
        with contextlib.suppress(FileNotFoundError):  # a backend that ended since pgrep
            total += cpu_seconds(int(pid))
    return total


def cpu_now(cluster: Cluster) -> dict[str, float]:
    """CPU seconds so far of the API, the worker processes, PostgreSQL and Redis: their
    difference over the deletions, per deletion, says what a deletion costs in CPU when wall
    time on a shared 2-core machine moves by tens of percent from run to run."""
    assert cluster.api is not None
    return {
        "api": cpu_seconds(cluster.api.pid),
        # distributed: the `lethe worker`s; embedded: the API's worker process
        "workers": sum(cpu_seconds(w.pid) for w in cluster.workers)
        + children_cpu_seconds(cluster.api.pid),
        "postgres": server_cpu("postgres"),
        "redis": server_cpu("redis-server"),
    }


def run(
    n: int,
    resident: int,
    methods: list[str],
    args: argparse.Namespace,
    tmp: Path,
    mode: str = "embedded",
    device: str = "cpu",
) -> dict:
    out: dict[str, Any] = {}
    with deployment(tmp / f"{mode}-n{n}-r{resident}", mode, resident, device) as (c, cluster):
        for method in methods:
            if method == "recollection" and n > args.recollection_max:
                out[method] = {"skipped": f"recollection's training is O(n²): n > {n}"}
                continue
            # a dataset per model: no fan-out
            ds_id, model_id, ids = trained_model(c, method, n, 50, args.features)
            idle, t0 = cpu_now(cluster), time.perf_counter()
            time.sleep(IDLE_SECONDS)  # what the processes spend doing nothing, subtracted below
            before, t1 = cpu_now(cluster), time.perf_counter()
            rows = [deletion(c, ds_id, model_id, ids[i]) for i in range(args.deletions)]
            time.sleep(IDLE_SECONDS)  # the compaction that the last deletions asked for
            after, t2 = cpu_now(cluster), time.perf_counter()
            cpu_ms = {
                k: 1000
                * (after[k] - before[k] - (before[k] - idle[k]) * (t2 - t1) / (t1 - t0))
                / len(rows)
                for k in before
            }
            out[method] = {
                "deletions": rows,
                "p50_post_to_certificate_s": statistics.median(
                    r["post_to_certificate_s"] for r in rows
                ),
                "p50_compute_s": statistics.median(r["compute_s"] for r in rows),
                "p50_plumbing_s": statistics.median(r["plumbing_s"] for r in rows),
                "cpu_ms_per_deletion": cpu_ms,  # each deletion's reads of the model included
            }
            print(
                f"{mode} n={n} resident={resident} {method}: "
                f"p50 POST→cert {out[method]['p50_post_to_certificate_s']:.3f} s, "
                f"compute {out[method]['p50_compute_s']:.3f} s, "
                f"rows loaded {[r['rows_loaded'] for r in rows]}, CPU ms per deletion "
                f"{ {k: round(v, 1) for k, v in cpu_ms.items()} }",
                flush=True,
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--deletions", type=int, default=4)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--recollection-max", type=int, default=100_000)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = args.methods.split(",")
    result: dict[str, Any] = {"sizes": sizes, "deletions": args.deletions, "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            for resident in (0, 2):
                key = f"n={n} resident_models={resident}"
                result["runs"][key] = run(n, resident, methods, args, Path(tmp))
    path = write_result("resident", result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
