"""minnorm through the embedded service at the issue-14 size: synthetic data, n = 5,001
training rows, p = 20,000 (19,999 random features + bias). Times training (the min-norm
solve, stored with its 200 MB Gram inverse) and POST→certificate of single-sample deletions,
which include loading the retained data and the state and writing the new one.

    .venv/bin/python -m bench.overparameterized_service [--deletions 3]

Writes bench/results/overparameterized_service.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from app.client import Client
from bench.cluster import Cluster
from bench.common import percentiles, ready, write_result


def run(c: Client, n_samples: int, deletions: int) -> dict:
    """Register synthetic data of `n_samples` (80 % train), train minnorm on p = 20,000
    random features, then time `deletions` single-sample deletions one after another."""
    ds = ready(
        c,
        c.post(
            "/v1/datasets",
            json={"builtin": "synthetic", "n_samples": n_samples, "n_features": 20, "n_classes": 2},
        ),
    )
    start = time.time()
    model = c.post(
        "/v1/models",
        json={
            "name": "minnorm",
            "dataset_id": ds["id"],
            "architecture": {"type": "random_features", "width": 19_999},
            "method": {"name": "minnorm"},
        },
    )
    model = c.wait_model(model["id"], timeout=7200).model_dump(mode="json")
    train_seconds = time.time() - start
    page = c.get(f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": deletions})
    latencies, compute = [], []
    for item in page["items"]:
        start = time.time()
        request = c.post(
            "/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": [item["external_id"]]}
        )
        assert c.wait_deletion(request["id"], timeout=7200).status == "done"
        latencies.append(time.time() - start)
        version = c.get(f"/v1/models/{model['id']}")["current_version"]
        compute.append(version["metrics"]["unlearn_seconds"])
    return {
        "n_train": model["n_train"],
        "p": 20_000,
        "state_bytes": version["metrics"]["storage"]["state_bytes"],
        "train_seconds_post_to_ready": train_seconds,
        "post_to_certificate_seconds": percentiles(latencies),
        "unlearn_compute_seconds": percentiles(compute),
        "route": version["metrics"]["route"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deletions", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), None, None) as cluster:
        c = Client(cluster.start_api(), cluster.admin_key, timeout=3600)
        result = run(c, 6252, args.deletions)
    print(result)
    print(f"wrote {write_result('overparameterized_service', result)}")


if __name__ == "__main__":
    main()
