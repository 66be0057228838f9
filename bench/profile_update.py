"""Where a warm single-sample deletion's time goes (issue 28): py-spy samples the embedded
`lethe serve` (API and inline worker in one process) while a client runs sequential
single-sample deletions on one model whose resident session is warm, and the busy samples
(threads waiting on a queue, a condition or a socket left out) are summed per function,
inclusive, as a share of the run.

    .venv/bin/python -m bench.profile_update [--n 100000] [--deletions 30]
        [--method output_perturbation] [--out update_profile]

Writes bench/results/<out>.json: POST→certificate per deletion and the top functions.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from app.client import Client
from bench.cluster import Cluster
from bench.common import write_result
from bench.profile_request import busy_shares
from bench.resident import METHODS, TRAINING


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--deletions", type=int, default=30)
    parser.add_argument("--method", default="output_perturbation")
    parser.add_argument("--out", default="update_profile")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with Cluster(tmp / "lethe", None, None, torch_threads=1) as cluster:
            c = Client(cluster.start_api(), cluster.admin_key, timeout=3600)
            body = {"builtin": "synthetic", "n_samples": args.n, "n_features": 20, "n_classes": 2}
            ds = c.post("/v1/datasets", json=body)
            spec: dict[str, Any] = {
                "name": "m",
                "dataset_id": ds["id"],
                "training": TRAINING,
                "architecture": {"type": "logreg"},
                **METHODS[args.method],
            }
            model = c.wait_model(c.create_model(spec).id)
            assert model.status == "ready", model.error
            page = c.samples(ds["id"], split="train", limit=args.deletions + 1)
            ids = [s.external_id or "" for s in page.items]
            c.wait_deletion(c.delete(ds["id"], ids[:1]).id)  # warm: the first is not sampled
            assert cluster.api is not None
            spy_proc = subprocess.Popen(
                [spy, "record", "--pid", str(cluster.api.pid), "-r", "250", "--format", "raw"]
                + ["--threads", "-o", str(tmp / "raw.txt")],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
            seconds = []
            for sample in ids[1:]:
                t0 = time.perf_counter()
                done = c.wait_deletion(c.delete(ds["id"], [sample]).id)
                seconds.append(time.perf_counter() - t0)
                assert done.status == "done"
            spy_proc.send_signal(signal.SIGINT)
            spy_proc.wait(timeout=60)
        total, shares = busy_shares(tmp / "raw.txt")
    result = {
        "n": args.n,
        "method": args.method,
        "post_to_certificate_s": seconds,
        "p50_post_to_certificate_s": statistics.median(seconds),
        "busy_samples": total,
        "inclusive_share": shares,
    }
    print(f"p50 POST→certificate {result['p50_post_to_certificate_s']:.3f} s")
    for name, share in shares[:45]:
        print(f"{share:6.1%} {name}")
    print("wrote", write_result(args.out, result))


if __name__ == "__main__":
    main()
