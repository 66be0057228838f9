"""Foundation figures on the embedded service: digits `mlp` training time and test accuracy,
and POST→certificate latency of exact `retrain` deletions (one sample each).

    .venv/bin/python -m bench.foundation [--deletions 10]

Writes bench/results/foundation.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from app.client import Client
from bench.common import embedded_server, percentiles, write_result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deletions", type=int, default=10)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, embedded_server(Path(tmp)) as (url, key):
        c = Client(url, key, timeout=600)
        ds = c.post("/v1/datasets", json={"builtin": "digits"})
        start = time.perf_counter()
        model = c.post(
            "/v1/models",
            json={
                "name": "digits-mlp",
                "dataset_id": ds["id"],
                "architecture": {"type": "mlp", "hidden": [64, 64], "activation": "relu"},
                "training": {"epochs": args.epochs, "batch_size": 64, "learning_rate": 0.1},
                "method": {"name": "retrain"},
            },
        )
        model = c.wait_model(model["id"]).model_dump(mode="json")
        post_to_ready = time.perf_counter() - start
        v1 = model["current_version"]["metrics"]
        train_ids = [
            s["external_id"]
            for s in c.get(
                f"/v1/datasets/{ds['id']}/samples",
                params={"split": "train", "limit": args.deletions},
            )["items"]
        ]
        latencies, retrain_seconds = [], []
        for sample in train_ids:
            t0 = time.perf_counter()
            req = c.post("/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": [sample]})
            req = c.wait_deletion(req["id"]).model_dump(mode="json")
            assert req["status"] == "done" and req["certificate_ids"], req
            latencies.append(time.perf_counter() - t0)
        for v in c.get(f"/v1/models/{model['id']}/versions")[1:]:
            retrain_seconds.append(v["metrics"]["unlearn_seconds"])
        final = c.get(f"/v1/models/{model['id']}")["current_version"]["metrics"]
        verify = c.get("/v1/audit/verify")
    result = {
        "model": "digits mlp 64-64 relu, 20 epochs, batch 64, lr 0.1, embedded mode",
        "training_seconds_in_worker": v1["train_seconds"],
        "post_to_ready_seconds": post_to_ready,
        "test_accuracy_v1": v1["test_accuracy"],
        "retrain_deletion_post_to_certificate_seconds": percentiles(latencies),
        "retrain_compute_seconds": percentiles(retrain_seconds),
        "test_accuracy_after_deletions": final["test_accuracy"],
        "audit_chain_ok": verify["ok"],
        "certificates": verify["checked"],
    }
    path = write_result("foundation", result)
    print(f"wrote {path}")
    for k, v in result.items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
