"""MLflow (issue 58's closing figures), side by side in one run: two embedded `lethe serve`s
with the same digits convex_head model, one without and one with `LETHE_MLFLOW_TRACKING_URI`
(a real `mlflow server`, tests/servers.py); k deletions filed one after another on each.
Reports POST→certificate p50/p99 on each (the copy is off the request path), and for the copy:
each version's registration time (upload, model version, alias: `mlflow.seconds`), commit→
registered and commit→purged (the version's `created_at`, its `erased_at`, to the copy's
`registered_at`, `purged_at`).

    .venv/bin/python -m bench.mlflow_export [--deletions 30]

Writes bench/results/mlflow_export.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.cluster import Cluster
from bench.common import write_result
from bench.webhooks import deletions, digits_convex_head, quantiles
from tests.servers import MlflowServer


def run(tmp: Path, k: int, **settings: object) -> tuple[list[float], list[dict[str, Any]]]:
    """k one-row deletions on a fresh service; POST→certificate each, and the versions once
    every copy settled (registered or purged)."""
    with Cluster(tmp / "data", None, None, **settings) as cluster:
        cluster.start_api()
        with cluster.client() as c:
            dataset, model, ids = digits_convex_head(c, "mlflow", k + 2)
            deletions(c, dataset, ids[:2])  # warm: the model's session resident
            seconds = deletions(c, dataset, ids[2:])
            deadline = time.monotonic() + 600
            while True:
                versions = c.get(f"/v1/models/{model}/versions").json()
                settled = all(
                    v["mlflow"] is not None
                    and v["mlflow"]["status"] in (("purged", "skipped") if v["erased_at"]
                                                  else ("registered",))
                    for v in versions
                )  # fmt: skip
                if not settings or settled or time.monotonic() > deadline:
                    return seconds, versions
                time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deletions", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        off, _ = run(Path(tmp) / "off", args.deletions)
        server = MlflowServer(Path(tmp) / "mlflow")
        server.start()
        try:
            on, versions = run(
                Path(tmp) / "on", args.deletions, mlflow_tracking_uri=server.url,
                mlflow_poll_seconds=0.2,
            )  # fmt: skip
        finally:
            server.kill()

    def between(a: str | None, b: str | None) -> float | None:
        if a is None or b is None:
            return None
        return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()

    copies = [v["mlflow"] for v in versions if v["mlflow"] is not None]
    registration = [m["seconds"] for m in copies if m["seconds"] is not None]
    to_registered = [
        between(v["created_at"], (v["mlflow"] or {}).get("registered_at")) for v in versions
    ]
    to_purged = [between(v["erased_at"], (v["mlflow"] or {}).get("purged_at")) for v in versions]
    result = {
        "deletions_per_phase": len(off),
        "post_to_certificate": {"mlflow_off": quantiles(off), "mlflow_on": quantiles(on)},
        "registration_seconds_per_version": quantiles(registration),
        "commit_to_registered": quantiles([s for s in to_registered if s is not None]),
        "purge_to_artifact_deleted": quantiles([s for s in to_purged if s is not None]),
        "versions": len(versions),
        "statuses": {
            s: sum(m["status"] == s for m in copies) for s in {m["status"] for m in copies}
        },
        "failed_attempts": sum(m["attempts"] for m in copies),
        "weights_bytes": versions[-1]["weights_size"],
        "poll_seconds": 0.2,
    }
    print(json.dumps(result, indent=1))
    write_result("mlflow_export", result)


if __name__ == "__main__":
    main()
