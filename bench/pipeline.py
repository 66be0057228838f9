"""Deletion-pipeline throughput and latency, distributed and embedded.

Distributed: `lethe serve` + 2 `lethe worker`s on the PostgreSQL and Redis on loopback (a fresh
database per run). Embedded: `lethe serve` alone (SQLite file + inline worker). In both, N
concurrent clients POST single-sample deletions against a digits `logreg` model as fast as
the API accepts them.

    .venv/bin/python -m bench.pipeline [--requests 400] [--clients 8] [--workers 2]

Reports sustained deletions per second (requests / (last done - first POST)), p50/p99
POST→done latency, and the mean coalesced batch size (requests per new version). Writes
bench/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import DeletionRequest, ModelVersion
from bench.common import REDIS, percentiles, scratch_database, write_result
from tests.support.cluster import Cluster


def run(cluster: Cluster, db_url: str, n_requests: int, n_clients: int) -> dict:
    with cluster.client(timeout=600) as c:
        ds = c.post("/v1/datasets", json={"builtin": "digits"}).json()
        model = c.post(
            "/v1/models",
            json={"name": "bench", "dataset_id": ds["id"], "architecture": {"type": "logreg"}},
        ).json()
        while c.get(f"/v1/models/{model['id']}").json()["status"] != "ready":
            time.sleep(0.2)
        ids = []
        while len(ids) < n_requests:
            page = c.get(
                f"/v1/datasets/{ds['id']}/samples",
                params={"split": "train", "limit": 1000, "offset": len(ids)},
            ).json()["items"]
            ids += [s["external_id"] for s in page][: n_requests - len(ids)]
    requester = cluster.new_key("requester")
    posted: dict[int, float] = {}

    def client(chunk: list[str]) -> None:
        with cluster.client(requester) as rc:
            for sample in chunk:
                t = time.time()
                r = rc.post("/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": [sample]})
                r.raise_for_status()
                posted[r.json()["id"]] = t

    start = time.time()
    with ThreadPoolExecutor(n_clients) as pool:
        list(pool.map(client, [ids[k::n_clients] for k in range(n_clients)]))
    post_seconds = time.time() - start
    while True:
        with database(db_url).write() as session:
            done = session.scalar(select(func.count()).where(DeletionRequest.status == "done"))
            failed = session.scalar(select(func.count()).where(DeletionRequest.status == "failed"))
        if done + failed >= n_requests:
            break
        time.sleep(0.2)
    with database(db_url).write() as session:
        finished = dict(
            session.execute(select(DeletionRequest.id, DeletionRequest.finished_at)).all()
        )
        versions = (
            session.scalar(select(func.count()).where(ModelVersion.model_id == model["id"])) - 1
        )
    ends = {rid: finished[rid].astimezone(UTC).timestamp() for rid in posted}
    latencies = [ends[rid] - posted[rid] for rid in posted]
    span = max(ends.values()) - start
    return {
        "requests": n_requests,
        "clients": n_clients,
        "failed": failed,
        "post_phase_seconds": post_seconds,
        "total_seconds": span,
        "sustained_deletions_per_second": n_requests / span,
        "post_to_done_seconds": percentiles(latencies),
        "updates": versions,
        "mean_coalesced_batch": n_requests / max(versions, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    results = {
        "model": "digits logreg, 20 epochs, batch 64; method retrain (exact)",
        "started": datetime.now(UTC).isoformat(),
    }

    with (
        scratch_database() as pg_url,
        tempfile.TemporaryDirectory() as tmp,
        Cluster(Path(tmp), pg_url, REDIS) as cluster,
    ):
        cluster.start_api()
        for _ in range(args.workers):
            cluster.start_worker()
        results["distributed"] = {
            "workers": args.workers,
            **run(cluster, pg_url, args.requests, args.clients),
        }

    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), None, None) as cluster:
        cluster.start_api()
        sqlite_url = f"sqlite:///{Path(tmp).resolve() / 'lethe.db'}"
        results["embedded"] = run(cluster, sqlite_url, args.requests, args.clients)
    path = write_result("pipeline", results)
    print(f"wrote {path}")
    for mode in ("distributed", "embedded"):
        r = results[mode]
        print(
            f"{mode}: {r['sustained_deletions_per_second']:.1f} deletions/s, "
            f"p50 {r['post_to_done_seconds']['p50']:.2f}s, "
            f"p99 {r['post_to_done_seconds']['p99']:.2f}s, "
            f"mean batch {r['mean_coalesced_batch']:.1f}, failed {r['failed']}"
        )


if __name__ == "__main__":
    main()
