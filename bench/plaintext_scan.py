"""Where an erased person's plaintext stays in memory (issue 53), for source trees side by side:
`lethe serve` registers a 300 × 32 CSV (ids `QZXV-NNNN-ERASEME`, 30 subjects), trains a
`retrain` and a `convex_head` model, erases one subject (10 rows), waits `--wait` seconds
(the TTL is 8 s: a worker that lived through the erasure gives way after 2 s idle), then
scans the memory of the API process and of its worker process (/proc/<pid>/mem, writable
regions) for each erased row's float32 and float64 bytes, its id (UTF-8 and UCS-4) and the
subject's id.

    .venv/bin/python -m bench.plaintext_scan [--other /tmp/base-tree] [--wait 8]

Writes bench/results/plaintext_scan.json.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from bench.cluster import Cluster
from bench.common import ready, run_in_tree, worker_processes, write_result
from tests.memory_scan import scan

N, D, PEOPLE, PERSON = 300, 32, 30, 7


def one(wait: float) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    X = rng.standard_normal((N, D)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int)
    lines = ["id,subject," + ",".join(f"f{j}" for j in range(D)) + ",label,split"]
    lines += [
        f"QZXV-{i:04d}-ERASEME,personKQJ{i % PEOPLE:02d},"
        + ",".join(repr(float(v)) for v in X[i])
        + f",{y[i]},{'test' if i < 50 else 'train'}"
        for i in range(N)
    ]
    gone = [i for i in range(N) if i % PEOPLE == PERSON]
    needles: dict[str, bytes] = {}
    for i in gone:
        needles[f"float32/{i}"] = X[i].tobytes()
        needles[f"float64/{i}"] = X[i].astype(np.float64).tobytes()
        needles[f"id-utf8/{i}"] = f"QZXV-{i:04d}-ERASEME".encode()
        needles[f"id-ucs4/{i}"] = f"QZXV-{i:04d}-ERASEME".encode("utf-32-le")
    needles["subject-utf8/"] = f"personKQJ{PERSON:02d}".encode()
    needles["subject-ucs4/"] = f"personKQJ{PERSON:02d}".encode("utf-32-le")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = Cluster(Path(tmp), None, None, plaintext_ttl_seconds=8)
        cluster.start_api()
        with cluster, cluster.client() as c:
            assert cluster.api is not None
            ds = ready(
                c,
                c.post(
                    "/v1/datasets",
                    files={"file": ("d.csv", io.BytesIO("\n".join(lines).encode()))},
                    data={"id_column": "id", "subject_column": "subject", "split_column": "split"},
                ),
            )
            for method in ({"name": "retrain"}, {"name": "convex_head", "lam": 1e-2, "R": 20.0}):
                model = c.post(
                    "/v1/models",
                    json={
                        "name": method["name"],
                        "dataset_id": ds["id"],
                        "architecture": {"type": "logreg"},
                        "method": method,
                    },
                ).json()
                while c.get(f"/v1/models/{model['id']}").json()["status"] not in (
                    "ready",
                    "failed",
                ):
                    time.sleep(0.2)
            answer = c.post(
                "/v1/deletions",
                json={"dataset_id": ds["id"], "subject_ids": [f"personKQJ{PERSON:02d}"]},
                headers={"Prefer": "wait=60"},
            )
            assert answer.json()["status"] == "done", answer.text
            time.sleep(wait)
            api = cluster.api.pid
            for name, pid in [("api", api)] + [("worker", p) for p in worker_processes(api)]:
                hits = scan(pid, needles)
                kinds: Counter[str] = Counter()
                rows: dict[str, set[str]] = {}
                for key, count in hits.items():
                    if count:
                        kind, row = key.split("/")
                        kinds[kind] += count
                        rows.setdefault(kind, set()).add(row)
                out[name] = {
                    "occurrences": dict(kinds),
                    "erased_rows_found": {k: len(v) for k, v in rows.items() if k[0] != "s"},
                }
    return {"erased_rows": len(gone), "wait_s": wait, **out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--other", type=Path, help="an older source tree, run first")
    parser.add_argument("--wait", type=float, default=8.0)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.wait)))
        return
    runs = {}
    trees = ([args.other] if args.other else []) + [Path(__file__).resolve().parents[1]]
    for tree in trees:
        commit, found = run_in_tree(tree, "bench.plaintext_scan", ["--wait", str(args.wait)])
        runs[commit] = found
        print(commit, json.dumps(found), flush=True)
    print(write_result("plaintext_scan", {"runs": runs}))


if __name__ == "__main__":
    main()
