"""The update path.

Latency: embedded `lethe serve` (SQLite + inline worker), digits logreg, sequential single-
sample deletions: POST→certificate (the client long-polls `GET /v1/deletions/{id}?wait=`), for
`recollection` and `convex_head`.

Throughput: distributed (`lethe serve` + 1 `lethe worker`, fresh PostgreSQL database, Redis),
one model, N single-sample requests. `capacity`: the requests are accepted while the
(warm, idle) worker is paused with SIGSTOP, then it resumes: N / (last finished − resume).
`sustained`: N POSTed by 16 threads while the worker runs: N / (last finished − first POST).
Both report the mean batch (requests per new version) and the signals the queue carried.

    .venv/bin/python -m bench.update_path [--requests 40] [--throughput 2000]

Writes bench/results/update_path.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from redis import Redis
from sqlalchemy import func, select

from app.client import Client
from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database
from app.core.db.tables import DeletionRequest, ModelVersion
from bench.common import REDIS, percentiles, ready, scratch_database, write_result
from tests.support.cluster import Cluster

BUDGET = {"epsilon": 1.0, "delta": 1e-5, "lineage_epsilon": 1000.0, "lineage_delta": 1e-3}
METHODS: dict[str, dict[str, Any]] = {
    "recollection": {
        "method": {"name": "recollection", "max_relative_noise": None},
        "privacy": BUDGET,
    },
    "convex_head": {
        "architecture": {"type": "logreg", "feature_norm": 9.0},
        "method": {"name": "convex_head", "lam": 1e-3, "R": 9.0, "beta": 1e-3},
        "privacy": BUDGET,
    },
}


def ready_model(c: Client, dataset: dict, method: str) -> dict:
    spec = {"name": method, "dataset_id": dataset["id"], "architecture": {"type": "logreg"}}
    model = c.post("/v1/models", json={**spec, **METHODS[method]})
    model = c.wait_model(model["id"]).model_dump(mode="json")
    assert model["status"] == "ready", model
    return model


def train_ids(c: Client, dataset_id: int, n: int) -> list[str]:
    ids: list[str] = []
    while len(ids) < n:
        page = c.get(
            f"/v1/datasets/{dataset_id}/samples",
            params={"split": "train", "limit": 1000, "offset": len(ids)},
        )["items"]
        if not page:
            break
        ids += [s["external_id"] for s in page]
    return ids[:n]


def wait_done(c: Client, request_id: int) -> dict:
    """Long-poll (`?wait=`); a server without it answers at once and this polls every 2 ms,
    so the before/after comparison measures the service, not a polling interval."""
    while True:
        req = c.get(f"/v1/deletions/{request_id}", params={"wait": 5})
        if req["status"] in ("done", "failed"):
            return req
        time.sleep(0.002)


def latency(n_requests: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), None, None) as cluster:
        url = cluster.start_api()
        c = Client(url, cluster.admin_key, timeout=600)
        for method in METHODS:  # one dataset each: a deletion reaches every model on it
            ds = c.post("/v1/datasets", json={"builtin": "digits"})
            model = ready_model(c, ds, method)
            chunk = train_ids(c, ds["id"], n_requests + 3)
            seconds, kinds = [], []
            for k, sample in enumerate(chunk):
                t0 = time.perf_counter()
                request = c.post(
                    "/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": [sample]}
                )
                done = wait_done(c, request["id"])
                if k >= 3:  # the first requests warm the worker's caches
                    seconds.append(time.perf_counter() - t0)
                cert = c.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}")
                kinds.append(cert["method"])
            out[method] = {
                "model_id": model["id"],
                "post_to_certificate_s": percentiles(seconds),
                "certified_by": sorted(set(kinds)),
            }
            p = out[method]["post_to_certificate_s"]
            print(
                f"{method}: POST→certificate p50 {p['p50'] * 1e3:.1f} ms, p90 "
                f"{p['p90'] * 1e3:.1f} ms ({kinds[-1]})",
                flush=True,
            )
    return out


def _versions(url: str, model_id: int) -> int:
    with database(url).read() as session:
        return int(session.scalar(select(func.count()).where(ModelVersion.model_id == model_id)))


def _finished(url: str) -> tuple[int, float | None, float | None]:
    with database(url).read() as session:
        n, first, last = session.execute(
            select(
                func.count(),
                func.min(DeletionRequest.created_at),
                func.max(DeletionRequest.finished_at),
            ).where(DeletionRequest.status == "done")
        ).one()
    return int(n), first.timestamp() if first else None, last.timestamp() if last else None


def _post_all(cluster: Cluster, key: str, dataset_id: int, ids: list[str]) -> float:
    def post(chunk: list[str]) -> None:
        with cluster.client(key) as hc:
            for sample in chunk:
                r = hc.post(
                    "/v1/deletions", json={"dataset_id": dataset_id, "sample_ids": [sample]}
                )
                r.raise_for_status()

    start = time.time()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(post, [ids[i::16] for i in range(16)]))
    return start


def throughput(method: str, n_requests: int, mode: str) -> dict[str, Any]:
    dataset = (
        {"builtin": "digits"}
        if method == "recollection"
        else {"builtin": "synthetic", "n_samples": 50_000, "n_features": 20, "n_classes": 2}
    )
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        url = stack.enter_context(scratch_database(migrate=False))
        upgrade_to_head(url)
        cluster = stack.enter_context(Cluster(tmp, url, REDIS))
        cluster.start_api()
        cluster.start_worker()
        c = Client(cluster.url, cluster.admin_key, timeout=3600)
        ds = ready(c, c.post("/v1/datasets", json=dataset))
        spec = dict(METHODS[method])
        if method == "convex_head":
            spec = {
                **spec,
                "architecture": {"type": "logreg", "feature_norm": 20.0},
                "method": {**spec["method"], "R": 20.0},
            }
        model = c.post(
            "/v1/models",
            json={
                "name": method,
                "dataset_id": ds["id"],
                "architecture": {"type": "logreg"},
                **spec,
            },
        )
        model = c.wait_model(model["id"]).model_dump(mode="json")
        ids = train_ids(c, ds["id"], n_requests)
        requester = cluster.new_key("requester")
        redis = Redis.from_url(REDIS)
        if mode == "capacity":  # the warm worker is paused while the requests arrive
            for w in cluster.workers:
                os.killpg(w.pid, signal.SIGSTOP)
            _post_all(cluster, requester, ds["id"], ids)
            depth = redis.llen(f"rq:queue:{cluster.queue}")
            start = time.time()
            for w in cluster.workers:
                os.killpg(w.pid, signal.SIGCONT)
        else:
            start = _post_all(cluster, requester, ds["id"], ids)
            depth = None
        deadline = time.time() + 1800
        while (done := _finished(url))[0] < len(ids) and time.time() < deadline:
            time.sleep(0.2)
        n, _, last = done
        versions = _versions(url, model["id"]) - 1
        seconds = (last or time.time()) - start
        result = {
            "method": method,
            "requests": len(ids),
            "done": n,
            "seconds": seconds,
            "deletions_per_second": n / seconds,
            "new_versions": versions,
            "mean_batch": n / max(versions, 1),
            "signals_waiting_before_worker": depth,
        }
        print(mode, result, flush=True)
        return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--throughput", type=int, default=2000)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--out", default="update_path")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    if not args.skip_latency:
        results["embedded_latency"] = latency(args.requests)
    if args.throughput:
        results["distributed"] = {
            f"{method}_{mode}": throughput(
                method,
                args.throughput if method != "recollection" else min(args.throughput, 1000),
                mode,
            )
            for method in ("convex_head", "recollection")
            for mode in ("capacity", "sustained")
        }
    print("wrote", write_result(args.out, results))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
