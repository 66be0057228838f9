"""What a deletion waits for when it arrives as a worker process gives way after an erasure
(issue 53's recycle, measured for issue 55's million-row models), side by side with an older
tree.

Embedded `lethe serve` (SQLite, its worker process), a builtin synthetic dataset of `--n`
rows × 256 features × 10 classes, a trained `convex_head` model (bench/convex_resident.py's
settings), LETHE_PLAINTEXT_TTL_SECONDS = 8 (the worker gives way after 2 s idle past an
erasure). Two single-row deletions warm the session (the first builds the resident state);
then, the moment the successor process appears (an event, not a sleep), one more deletion is
POSTed and timed to its certificate: it waits for the successor's warm-up of the million-row
session. A last deletion after it shows the warm state. The successor's own log line (this
tree's: read, then prepared or handed over) is kept where the tree writes one.

    .venv/bin/python -m bench.recycle_warm --other /tmp/base-tree [--n 1000000] [--out NAME]

Writes bench/results/recycle_warm.json (or NAME.json).
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ready, run_in_tree, worker_processes, write_result
from bench.convex_resident import OPTIONS

TTL_SECONDS = 8


def one(n: int) -> dict[str, Any]:
    from app.client import Client
    from bench.cluster import Cluster

    spec = {"builtin": "synthetic", "n_samples": n, "n_features": 256, "n_classes": 10}
    limits = {
        "max_dataset_cells": n * 256 + 1,
        "max_dataset_samples": n,
        "job_timeout_seconds": 7200,
        "plaintext_ttl_seconds": TTL_SECONDS,
    }
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), None, None, **limits) as cluster:
        c = Client(cluster.start_api(), cluster.admin_key, timeout=600)
        assert cluster.api is not None
        dataset = ready(c, c.post("/v1/datasets", json=spec))
        body = {"name": "head", "dataset_id": dataset["id"], "architecture": {"type": "logreg"},
                "method": {"name": "convex_head", **OPTIONS}}  # fmt: skip
        c.wait_model(c.create_model(body).id)
        page = c.get(f"/v1/datasets/{dataset['id']}/samples", params={"split": "train",
                     "limit": 4})  # fmt: skip
        ids = iter(s["external_id"] for s in page["items"])

        def delete() -> float:
            t0 = time.perf_counter()
            c.wait_deletion(c.delete(dataset["id"], [next(ids)]).id)
            return time.perf_counter() - t0

        first, warm = delete(), delete()
        (before,) = worker_processes(cluster.api.pid)
        t0 = time.perf_counter()
        while worker_processes(cluster.api.pid) in ([], [before]):  # the successor arrives
            time.sleep(0.05)
        appeared = time.perf_counter() - t0
        stalled = delete()
        after = delete()
        log = (cluster.data_dir / "api.log").read_text()
        warmed = re.findall(r"session warmed, (\d+) rows: (.*)", log)
    return {
        "n_samples": n,
        "first_deletion_s": first,
        "warm_deletion_s": warm,
        "successor_appeared_after_s": appeared,
        "deletion_as_the_successor_starts_s": stalled,
        "next_deletion_s": after,
        "successor_warm_up": [{"rows": int(r), "phases": p} for r, p in warmed],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--other", type=Path, help="an older source tree, run first")
    parser.add_argument("--out", default="recycle_warm")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.n)))
        return
    trees: dict[str, Any] = {}
    if args.other is not None:
        commit, found = run_in_tree(args.other, "bench.recycle_warm", ["--n", str(args.n)])
        trees[f"before ({commit})"] = found
        print("before", json.dumps(found), flush=True)
    here = Path(__file__).resolve().parents[1]
    commit, found = run_in_tree(here, "bench.recycle_warm", ["--n", str(args.n)])
    trees[f"this tree ({commit})"] = found
    print("this tree", json.dumps(found), flush=True)
    print(write_result(args.out, {"ttl_seconds": TTL_SECONDS, "trees": trees}))


if __name__ == "__main__":
    main()
