"""What issue 53's memory and restore work costs a user, side by side with an older tree:
registering an upload (now parsed in a forked child), a warm single-sample deletion
POST→certificate (now with the journal's fsync on the request path), and the first deletion
after a pause long enough for the worker to give way after an erasure (now a fresh process
that rebuilds its resident state).

Embedded `lethe serve` (SQLite, worker process), a synthetic CSV of `--rows` × 20 features,
a `convex_head` model (λ = 1e-2, R = 20), LETHE_PLAINTEXT_TTL_SECONDS = 8 (the worker gives
way after 2 s idle). Each tree runs in its own interpreter (`--one`).

    .venv/bin/python -m bench.plaintext_costs --other /tmp/base-tree [--rows 50000] [--out NAME]

Writes bench/results/plaintext_costs.json (or NAME.json: issue 54 compared its refactor with
`--out runtime_costs`).
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.cluster import Cluster
from bench.common import percentiles, ready, run_in_tree, worker_processes, write_result

PAUSE_SECONDS = 15.0  # past the 2 s idle grace (TTL 8 s), the successor's start and its warm-up


def csv_rows(n: int, d: int = 20) -> bytes:
    rng = np.random.default_rng(5)
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    lines = ["id," + ",".join(f"f{j}" for j in range(d)) + ",label"]
    lines += [f"r{i}," + ",".join(f"{v:.5f}" for v in X[i]) + f",{y[i]}" for i in range(n)]
    return "\n".join(lines).encode()


def delete_one(c: httpx.Client, dataset: int, sample: str) -> float:
    t0 = time.perf_counter()
    answer = c.post(
        "/v1/deletions",
        json={"dataset_id": dataset, "sample_ids": [sample]},
        headers={"Prefer": "wait=120"},
    )
    assert answer.status_code == 200 and answer.json()["status"] == "done", answer.text
    return time.perf_counter() - t0


def one(rows: int, warm: int, cold: int) -> dict[str, Any]:
    body = csv_rows(rows)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), None, None, plaintext_ttl_seconds=8)
        cluster.start_api()
        with cluster, cluster.client() as c:
            assert cluster.api is not None
            t0 = time.perf_counter()
            small = c.post(
                "/v1/datasets",
                files={"file": ("s.csv", io.BytesIO(csv_rows(200)))},
                data={"id_column": "id"},
            )
            first = time.perf_counter() - t0  # the first upload after start (200 rows)
            assert small.status_code == 201, small.text
            t0 = time.perf_counter()
            ds = c.post(
                "/v1/datasets",
                files={"file": ("d.csv", io.BytesIO(body))},
                data={"id_column": "id"},
                timeout=600,
            )
            assert ds.status_code in (201, 202), ds.text  # past 10,000 rows: a job (issue 55)
            dataset = ready(c, ds)["id"]
            register = time.perf_counter() - t0
            model = c.post(
                "/v1/models",
                json={
                    "name": "m",
                    "dataset_id": dataset,
                    "architecture": {"type": "logreg"},
                    "method": {"name": "convex_head", "lam": 1e-2, "R": 20.0},
                },
            ).json()
            while c.get(f"/v1/models/{model['id']}").json()["status"] not in ("ready", "failed"):
                time.sleep(0.5)
            ids = iter(f"r{i}" for i in range(rows))
            delete_one(c, dataset, next(ids))  # the first update builds the resident state
            warm_s = [delete_one(c, dataset, next(ids)) for _ in range(warm)]
            cold_s, gave_way = [], 0
            for _ in range(cold):
                before = worker_processes(cluster.api.pid)
                time.sleep(PAUSE_SECONDS)
                gave_way += worker_processes(cluster.api.pid) != before
                cold_s.append(delete_one(c, dataset, next(ids)))
    return {
        "rows": rows,
        "first_upload_after_start_s": first,
        "register_upload_s": register,
        "warm_post_to_certificate_s": percentiles(warm_s),
        "after_pause_post_to_certificate_s": cold_s,
        "workers_replaced_in_pauses": gave_way,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--other", type=Path, help="an older source tree, run first")
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--warm", type=int, default=15)
    parser.add_argument("--cold", type=int, default=3)
    parser.add_argument("--out", default="plaintext_costs", help="the results file's name")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.rows, args.warm, args.cold)))
        return
    options = ["--rows", str(args.rows), "--warm", str(args.warm), "--cold", str(args.cold)]
    runs = {}
    trees = ([args.other] if args.other else []) + [Path(__file__).resolve().parents[1]]
    for tree in trees:
        commit, found = run_in_tree(tree, "bench.plaintext_costs", options)
        runs[commit] = found
        print(commit, found, flush=True)
    print(write_result(args.out, {"runs": runs}))


if __name__ == "__main__":
    main()
