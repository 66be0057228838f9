"""sharded_retrain's shards across the worker pool: the same deletions with 1 and 2 workers.

Distributed: `lethe serve` and N `lethe worker`s (one compute thread each, so the workers and
not a thread pool share the cores) on the PostgreSQL and Redis on loopback, a fresh database
per run. A synthetic task (the `synthetic` builtin) is trained as S shards of one slice each;
each deletion removes rows from every shard, so it retrains all S of them: with two workers,
the parent and a helper each take shards (workers/shards.py). A third run gives the single
worker two threads, the other way to spend the second core.

    .venv/bin/python -m bench.shard_pool [--samples 100000] [--shards 2] [--deletions 8]

Writes bench/results/shard_pool.json: training and POST → done per deletion, per setting.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import REDIS, machine, percentiles, ready, scratch_database, write_result
from tests.support.cluster import Cluster

SETTINGS = (
    ("1 worker, 1 thread", 1, 1),
    ("2 workers, 1 thread each", 2, 1),
    ("1 worker, 2 threads", 1, 2),
)
ARCHITECTURE = {"type": "mlp", "hidden": [256, 256]}
TRAINING = {"epochs": 6, "batch_size": 64, "learning_rate": 0.1, "weight_decay": 1e-4, "seed": 0}


def wait_ready(c: httpx.Client, model_id: int) -> dict[str, Any]:
    while True:
        model = c.get(f"/v1/models/{model_id}").json()
        if model["status"] in ("ready", "failed"):
            assert model["status"] == "ready", model.get("error")
            return model
        time.sleep(0.2)


def wait_done(c: httpx.Client, request_id: str) -> dict[str, Any]:
    while True:
        answer = c.get(f"/v1/deletions/{request_id}", params={"wait": 30}).json()
        if answer["status"] in ("done", "failed"):
            assert answer["status"] == "done", answer
            return answer


def run(cluster: Cluster, samples: int, shards: int, deletions: int) -> dict[str, Any]:
    with cluster.client(timeout=900) as c:
        dataset = {"builtin": "synthetic", "n_samples": samples, "n_features": 40, "n_classes": 10}
        ds = ready(c, c.post("/v1/datasets", json=dataset))
        method = {"name": "sharded_retrain", "shards": shards, "slices": 1}
        body = {
            "name": "b",
            "dataset_id": ds["id"],
            "architecture": ARCHITECTURE,
            "training": TRAINING,
            "method": method,
        }
        start = time.perf_counter()
        model = c.post("/v1/models", json=body).json()
        wait_ready(c, model["id"])
        train_seconds = time.perf_counter() - start
        page = c.get(
            f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": 8 * deletions}
        ).json()["items"]
        ids = [s["external_id"] for s in page]
        seconds, retrained = [], []
        for k in range(deletions):
            start = time.perf_counter()
            chosen = ids[8 * k : 8 * (k + 1)]  # eight rows: every shard, almost surely
            posted = c.post("/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": chosen})
            done = wait_done(c, posted.json()["id"])
            seconds.append(time.perf_counter() - start)
            cert = c.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}").json()
            retrained.append(len(cert["sharding"]["retrained"]))
    return {
        "train_seconds": train_seconds,
        "post_to_done_seconds": percentiles(seconds),
        "each": seconds,
        "shards_retrained": retrained,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--deletions", type=int, default=8)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "task": f"synthetic {args.samples} × 40, 10 classes; {ARCHITECTURE}; {TRAINING}",
        "shards": args.shards,
        "machine": machine(),
        "settings": {},
    }
    for name, workers, threads in SETTINGS:
        with (
            scratch_database() as pg_url,
            tempfile.TemporaryDirectory() as tmp,
            Cluster(Path(tmp), pg_url, REDIS, torch_threads=threads) as cluster,
        ):
            cluster.start_api()
            for _ in range(workers):
                cluster.start_worker()
            results["settings"][name] = {
                "workers": workers,
                "threads": threads,
                **run(cluster, args.samples, args.shards, args.deletions),
            }
            print(name, results["settings"][name]["post_to_done_seconds"]["p50"], flush=True)
    one, two = (results["settings"][n[0]] for n in SETTINGS[:2])
    results["speedup_2_workers"] = {
        "deletion": one["post_to_done_seconds"]["p50"] / two["post_to_done_seconds"]["p50"],
        "training": one["train_seconds"] / two["train_seconds"],
    }
    print(f"wrote {write_result('shard_pool', results)}: {results['speedup_2_workers']}")


if __name__ == "__main__":
    main()
