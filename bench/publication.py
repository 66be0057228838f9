"""Does the clock tell the branch? POST /v1/deletions (with `Prefer: wait`) until its answer
says done, for a convex_head model whose update is released by the method and for one whose
update is the exact retrain (its requests ask for an ε so small that the utility floor sends
them to the retrain), each n times, with and without constant-time publication
(`publish_after_seconds`); a two-sample Kolmogorov–Smirnov test per setting says whether a
requester's clock separates the branches, and the medians what the option costs.

    .venv/bin/python -m bench publication-timing [--requests 30] [--after 2.0]

An embedded `lethe serve` on SQLite; the digits dataset registered once per model.
Writes bench/results/publication_timing.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from scipy.stats import ks_2samp

from bench.common import write_result
from tests.support.cluster import Cluster

HEAD = {"name": "convex_head", "lam": 0.01, "R": 8.0}
BRANCHES = {"method": None, "exact retrain": 1e-4}  # the requests' ε (None: the policy's)


def model(c: httpx.Client, after: float | None) -> tuple[int, int]:
    """A fresh digits dataset and a convex_head model on it, ready: (dataset, model)."""
    ds = c.post("/v1/datasets", json={"builtin": "digits"}).json()["id"]
    spec = {"name": "timed", "dataset_id": ds, "architecture": {"type": "logreg"},
            "method": HEAD, "privacy": {"publish_after_seconds": after}}  # fmt: skip
    answer = c.post("/v1/models", json=spec)
    answer.raise_for_status()
    model_id = answer.json()["id"]
    while (status := c.get(f"/v1/models/{model_id}").json()["status"]) not in ("ready", "failed"):
        time.sleep(0.2)
    assert status == "ready", status
    return ds, model_id


def rows(c: httpx.Client, ds: int, n: int) -> list[str]:
    """The first n training rows' ids: one is removed per request."""
    page = c.get(f"/v1/datasets/{ds}/samples", params={"split": "train", "limit": n}).json()
    return [s["external_id"] for s in page["items"]]


def timed(
    c: httpx.Client, requester: httpx.Client, ds: int, row: str, epsilon: float | None
) -> dict:
    """One deletion of `row`: the requester's POST → done, and what ran."""
    body: dict = {"dataset_id": ds, "sample_ids": [row]}
    if epsilon is not None:
        body["epsilon"] = epsilon
    start = time.perf_counter()
    answer = requester.post("/v1/deletions", json=body, headers={"Prefer": "wait=60"})
    seconds = time.perf_counter() - start
    done = answer.json()
    assert done.get("status") == "done", (answer.status_code, done)
    cert = c.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}").json()
    return {"seconds": seconds, "method": cert["method"]}


def run(requests: int, after: float | None, cluster: Cluster) -> dict:
    key = cluster.new_key("requester")
    with cluster.client() as c, cluster.client(key) as requester:
        models = {branch: model(c, after) for branch in BRANCHES}
        ids = {branch: rows(c, ds, requests) for branch, (ds, _) in models.items()}
        samples: dict[str, list[float]] = {b: [] for b in BRANCHES}
        ran: dict[str, set[str]] = {b: set() for b in BRANCHES}
        for k in range(requests):  # interleaved, so load drifts alike over both
            for branch, epsilon in BRANCHES.items():
                one = timed(c, requester, models[branch][0], ids[branch][k], epsilon)
                samples[branch].append(one["seconds"])
                ran[branch].add(one["method"])
    method, retrain = samples["method"], samples["exact retrain"]
    ks = ks_2samp(method, retrain)
    return {
        "publish_after_seconds": after,
        "branches": {
            b: {
                "methods_that_ran": sorted(ran[b]),
                "n": len(s),
                "median_seconds": statistics.median(s),
                "min_seconds": min(s),
                "max_seconds": max(s),
                "seconds": s,
            }
            for b, s in samples.items()
        },
        "ks_statistic": float(ks.statistic),
        "ks_p_value": float(ks.pvalue),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30, help="per branch and setting")
    parser.add_argument("--after", type=float, default=2.0, help="publish_after_seconds")
    args = parser.parse_args()
    settings = {}
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), None, None) as cluster:
        cluster.start_api()
        for name, after in (("off", None), ("on", args.after)):
            settings[name] = run(args.requests, after, cluster)
            print(name, {k: v for k, v in settings[name].items() if k.startswith("ks")})
    path = write_result("publication_timing", {"requests": args.requests, "settings": settings})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
