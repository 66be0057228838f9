"""Deletions first (issue 53, goal 4): a single-sample deletion's POST→certificate time on the
embedded default (`lethe serve`, SQLite, the worker process) idle and with 10 big privacy
audits queued, for two source trees side by side in one run (today's code and another, e.g.
the commit before the change, checked out with `git worktree add`).

Per tree: a fresh service; dataset A (breast_cancer) with 10 logreg models, dataset B
(breast_cancer again) with one; `--requests` single-sample deletions on B one after another
(idle); then one audit per model of A (`--canaries`, random canaries) and, right after, the
same number of deletions on B (busy). Each deletion is timed from its POST to `done` (the
answer waits with `Prefer: wait=30`, then polls).

    .venv/bin/python -m bench.deletions_first [--other /tmp/before] [--requests 5]
        [--canaries 10000]

Writes bench/results/deletions_first.json: per tree, every time, the medians, the first and
the slowest busy deletion, and busy/idle (the first busy deletion is the one that meets the
queued audits: what the goal, within 2× idle, is about).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def _deletions(c: Any, dataset: int, ids: list[str]) -> list[float]:
    """Each id deleted alone, one after another: seconds from POST to done."""
    seconds = []
    for sample in ids:
        started = time.perf_counter()
        answer = c.post(
            "/v1/deletions",
            json={"dataset_id": dataset, "sample_ids": [sample]},
            headers={"Prefer": "wait=30"},
        ).json()
        while answer["status"] not in ("done", "failed"):
            time.sleep(0.02)
            answer = c.get(f"/v1/deletions/{answer['id']}").json()
        assert answer["status"] == "done", answer
        seconds.append(time.perf_counter() - started)
    return seconds


def run_tree(requests: int, canaries: int, models: int) -> dict[str, Any]:
    """The scenario in this process's tree."""
    from bench.cluster import Cluster

    with tempfile.TemporaryDirectory() as scratch, Cluster(Path(scratch), None, None) as cluster:
        cluster.start_api()
        with cluster.client(timeout=120) as c:

            def ready(body: dict[str, Any]) -> int:
                made = c.post("/v1/models", json=body).json()
                while c.get(f"/v1/models/{made['id']}").json()["status"] != "ready":
                    time.sleep(0.1)
                return int(made["id"])

            a = c.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()["id"]
            b = c.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()["id"]
            logreg = {"architecture": {"type": "logreg"}}
            audited = [ready({"name": f"a{i}", "dataset_id": a, **logreg}) for i in range(models)]
            ready({"name": "b", "dataset_id": b, **logreg})
            page = c.get(
                f"/v1/datasets/{b}/samples",
                params={"split": "train", "limit": 2 * requests},
            ).json()
            ids = [s["external_id"] for s in page["items"]]
            idle = _deletions(c, b, ids[:requests])
            audits = [
                c.post(
                    f"/v1/models/{m}/audits",
                    json={"canaries": canaries, "kind": "random", "seed": 1},
                ).json()["id"]
                for m in audited
            ]
            busy = _deletions(c, b, ids[requests:])
            pending = [
                c.get(f"/v1/audits/{x}").json()["status"] for x in audits
            ]  # how many audits the deletions overtook
            return {
                "idle_seconds": idle,
                "busy_seconds": busy,
                "idle_median": statistics.median(idle),
                "busy_median": statistics.median(busy),
                "busy_over_idle": statistics.median(busy) / statistics.median(idle),
                # the first deletion meets the queued audits; the median hides it
                "busy_first": busy[0],
                "busy_max": max(busy),
                "busy_max_over_idle": max(busy) / statistics.median(idle),
                "audits_not_done_when_deletions_were": sum(s != "done" for s in pending),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", help="a second source tree to run the same scenario in")
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--canaries", type=int, default=10_000)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="deletions_first")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_tree(args.requests, args.canaries, args.models)))
        return
    from bench.common import run_in_tree, write_result

    here = Path(__file__).resolve().parent.parent
    trees = {"this": here, **({"other": Path(args.other).resolve()} if args.other else {})}
    result: dict[str, Any] = {
        "requests": args.requests,
        "canaries": args.canaries,
        "models": args.models,
        "cpus": os.cpu_count(),
        "trees": {},
    }
    for label, tree in trees.items():
        args_one = ["--requests", str(args.requests), "--canaries", str(args.canaries),
                    "--models", str(args.models)]  # fmt: skip
        commit, found = run_in_tree(tree, "bench.deletions_first", args_one)
        result["trees"][label] = {"path": str(tree), "commit": commit, **found}
        print(label, {k: v for k, v in found.items() if not k.endswith("_seconds")})
    print(write_result(args.out, result))


if __name__ == "__main__":
    main()
