"""Webhooks and traces on the request path (issue 58's closing figure), side by side in one
run: accepted POST /v1/deletions per second with 16 clients (wrk, as bench/request_path.py)
on an embedded `lethe serve` (SQLite, its worker process applying the updates meanwhile), with
nothing on; with a webhook endpoint for every event (a receiver process verifying each
signature, tests/webhook_receiver.py); with traces exported by OTLP (a receiver thread in this
process that counts the bytes and decodes nothing, tests/otlp_receiver.py), with and without
a span per SQL statement, with 1 trace in 10 sampled, and with 1 in 100 and no SQL spans; and
with webhooks and sampled traces both. They run one after another, `--rounds` times in turn
(the machine's drift spreads over all), each on a fresh service with the same dataset and
model (synthetic 50,000 × 20, logreg, `retrain`).

    .venv/bin/python -m bench.observability [--seconds 15] [--rounds 2] [--configs off,...]

Writes bench/results/observability.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.cluster import Cluster, free_port
from bench.common import cpu_seconds, worker_processes, write_result
from bench.request_path import prepare, wrk
from tests.otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[1]
# tracing: every trace sampled (the worst case), with and without a span per SQL statement;
# sampled: 1 trace in 10 (OTEL_TRACES_SAMPLER=parentbased_traceidratio, the SDK's own knob);
# lean: 1 in 100 and no SQL spans (a production setting); both: webhooks and sampled traces
CONFIGS = (
    "off",
    "webhooks",
    "tracing",
    "tracing_without_sql",
    "tracing_sampled",
    "tracing_lean",
    "both",
    "both_lean",
)
SAMPLED = {"tracing_sampled": "0.1", "both": "0.1", "tracing_lean": "0.01", "both_lean": "0.01"}
WITHOUT_SQL = ("tracing_without_sql", "tracing_lean", "both_lean")


@contextlib.contextmanager
def webhook_receiver(tmp: Path, cluster: Cluster) -> Iterator[subprocess.Popen[bytes]]:
    port = free_port()
    with cluster.client() as c:
        hook = c.post(
            "/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/hook", "allow_private": True}
        ).json()
    env = {**os.environ, "LETHE_TEST_WEBHOOK_SECRETS": hook["secret"]}
    receiver = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "webhook_receiver.py"), str(port),
         str(tmp / "received.jsonl")],
        env=env,
    )  # fmt: skip
    try:
        yield receiver
    finally:
        receiver.kill()
        receiver.wait()


def one(config: str, seconds: float, clients: int, n_samples: int) -> dict[str, Any]:
    """One service with `config` on: POST/s and latency under 16 clients."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        cluster = stack.enter_context(Cluster(tmp / "lethe", None, None, torch_threads=1))
        spans: OtlpReceiver | None = None
        if config.startswith(("tracing", "both")):
            spans = OtlpReceiver(free_port(), decode=False)
            spans.start()
            stack.callback(spans.stop)
            cluster.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = spans.endpoint
            cluster.env["LETHE_TRACE_SQL"] = str(config not in WITHOUT_SQL).lower()
            if config in SAMPLED:
                cluster.env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
                cluster.env["OTEL_TRACES_SAMPLER_ARG"] = SAMPLED[config]
        cluster.start_api()
        p = prepare(cluster, n_samples, tmp)
        receiver = None
        if config.startswith(("webhooks", "both")):
            receiver = stack.enter_context(webhook_receiver(tmp, cluster))
        assert cluster.api is not None
        api, worker = cluster.api.pid, worker_processes(cluster.api.pid)
        cpu = [cpu_seconds(api), sum(map(cpu_seconds, worker))]
        cpu.append(cpu_seconds(receiver.pid) if receiver is not None else 0.0)
        env = {
            "WRK_IDS": str(p["ids_file"]),
            "WRK_DATASET": str(p["dataset_id"]),
            "WRK_PATH": "/v1/deletions",
            "WRK_KEY": p["requester"],
        }
        posts = wrk("deletions.lua", cluster.url, seconds, clients, env)
        # the CPU each process used under load: the receiver's is this machine's, not the
        # service's (a receiver runs elsewhere), and shares the 2 cores with it
        used = [cpu_seconds(api) - cpu[0], sum(map(cpu_seconds, worker)) - cpu[1]]
        used.append(cpu_seconds(receiver.pid) - cpu[2] if receiver is not None else 0.0)
        time.sleep(2.0)  # the last batch's spans and events leave
        with cluster.client() as c:
            versions = len(c.get(f"/v1/models/{p['model_id']}/versions").json())
        return {
            "per_second": posts["per_second"],
            "p50_ms": posts.get("p50_ms"),
            "p99_ms": posts.get("p99_ms"),
            "requests": posts["requests"],
            "versions": versions,
            "otlp_bytes_received": spans.received_bytes if spans is not None else 0,
            "cpu_seconds": {"api": used[0], "worker": used[1], "webhook_receiver": used[2]},
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, off first")
    parser.add_argument("--out", default="observability", help="results/OUT.json")
    args = parser.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    if configs[0] != "off" or not set(configs) <= set(CONFIGS):
        parser.error(f"--configs: 'off' first, then any of {', '.join(CONFIGS)}")
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for config in configs:
            runs[config].append(one(config, args.seconds, args.clients, args.samples))
            print(config, json.dumps(runs[config][-1]), flush=True)
    off = statistics.median(r["per_second"] for r in runs["off"])
    result = {
        "seconds": args.seconds,
        "clients": args.clients,
        "samples": args.samples,
        "sampling": {c: SAMPLED.get(c, "1" if c.startswith("tracing") else None) for c in configs},
        "posts_per_second_median": {
            c: statistics.median(r["per_second"] for r in runs[c]) for c in configs
        },
        "ratio_to_off": {
            c: statistics.median(r["per_second"] for r in runs[c]) / off for c in configs
        },
        # the API process's CPU per accepted POST (its own work, whatever the machine's load)
        "api_cpu_ms_per_post_median": {
            c: statistics.median(
                1000 * r["cpu_seconds"]["api"] / max(1, r["requests"]) for r in runs[c]
            )
            for c in configs
        },
        "runs": runs,
    }
    print(json.dumps(result, indent=1))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
