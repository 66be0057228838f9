"""Webhooks (issue 58's closing figures), side by side in one run: an embedded `lethe serve`
with a digits convex_head model; k deletions filed one after another (`Prefer: wait`), first
with no webhook endpoint, then with one whose receiver (tests/webhook_receiver.py, verifying
every signature) answers on loopback. Per phase: POST→certificate p50/p99 as the client sees
it; with the endpoint, each delivery's commit→delivered latency (the outbox row's
`created_at` to `delivered_at`, from GET /v1/webhooks/{id}/deliveries) p50/p99, and whether
every event arrived with a valid signature.

    .venv/bin/python -m bench.webhooks [--deletions 40]

Writes bench/results/webhooks.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.cluster import Cluster, free_port
from bench.common import write_result

ROOT = Path(__file__).resolve().parents[1]


def quantiles(values: list[float]) -> dict[str, float]:
    a = np.asarray(values) * 1000
    return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "n": len(values)}  # fmt: skip


def deletions(c: Any, dataset: int, ids: list[str]) -> list[float]:
    """POST→certificate per deletion, one at a time."""
    seconds = []
    for sample in ids:
        t0 = time.perf_counter()
        answer = c.post(
            "/v1/deletions",
            json={"dataset_id": dataset, "sample_ids": [sample]},
            headers={"Prefer": "wait=30"},
        )
        assert answer.json()["status"] == "done", answer.text
        seconds.append(time.perf_counter() - t0)
    return seconds


def digits_convex_head(c: Any, name: str, n_ids: int) -> tuple[int, int, list[str]]:
    """Digits registered and a logreg convex_head model on it trained: the dataset's and
    the model's ids, and the first `n_ids` training rows' external ids (the deletions)."""
    dataset = c.post("/v1/datasets", json={"builtin": "digits"}).json()["id"]
    model = c.post(
        "/v1/models",
        json={"name": name, "dataset_id": dataset, "architecture": {"type": "logreg"},
              "method": {"name": "convex_head", "lam": 0.01, "R": 10.0}},
    ).json()["id"]  # fmt: skip
    while c.get(f"/v1/models/{model}").json()["status"] != "ready":
        time.sleep(0.2)
    items = c.get(
        f"/v1/datasets/{dataset}/samples", params={"split": "train", "limit": n_ids}
    ).json()["items"]
    return dataset, model, [s["external_id"] for s in items]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deletions", type=int, default=40)
    args = parser.parse_args()
    k = args.deletions
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp) / "data", None, None) as cluster:
        cluster.start_api()
        with cluster.client() as c:
            dataset, _, ids = digits_convex_head(c, "hooks", 2 * k)
            deletions(c, dataset, ids[:2])  # warm: the model's session resident
            off = deletions(c, dataset, ids[2:k])
            port = free_port()
            hook = c.post(
                "/v1/webhooks",
                json={"url": f"http://127.0.0.1:{port}/hook", "allow_private": True},
            ).json()
            out = Path(tmp) / "received.jsonl"
            env = {**os.environ, "LETHE_TEST_WEBHOOK_SECRETS": hook["secret"]}
            receiver = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "webhook_receiver.py"), str(port), str(out)],
                env=env,
            )
            try:
                time.sleep(1.0)
                on = deletions(c, dataset, ids[k : 2 * k - 2])
                deadline = time.monotonic() + 60
                while True:
                    page = c.get(
                        f"/v1/webhooks/{hook['id']}/deliveries", params={"limit": 1000}
                    ).json()
                    if all(d["status"] == "delivered" for d in page["items"]) or (
                        time.monotonic() > deadline
                    ):
                        break
                    time.sleep(0.2)
            finally:
                receiver.kill()
            received = [json.loads(line) for line in out.read_text().splitlines()]
    latency = [
        (
            datetime.fromisoformat(d["delivered_at"]) - datetime.fromisoformat(d["created_at"])
        ).total_seconds()
        for d in page["items"]
        if d["delivered_at"]
    ]
    result = {
        "deletions_per_phase": len(off),
        "post_to_certificate": {"webhooks_off": quantiles(off), "webhooks_on": quantiles(on)},
        "commit_to_delivered": quantiles(latency),
        "events": page["total"],
        "delivered": sum(d["status"] == "delivered" for d in page["items"]),
        "received_with_valid_signature": sum(e["valid"] for e in received),
        "received": len(received),
        "poll_seconds": 0.2,
    }
    print(json.dumps(result, indent=1))
    write_result("webhooks", result)


if __name__ == "__main__":
    main()
