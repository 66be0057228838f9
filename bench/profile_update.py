"""Where a warm single-sample deletion's time goes (issue 28): py-spy samples the service's
processes while a client runs sequential single-sample deletions on one model whose resident
session is warm — embedded, the one `lethe serve` (API and inline worker); distributed, the
API and the `lethe worker` (PostgreSQL, Redis) each — and the busy samples (threads waiting on
a queue, a condition or a socket left out) are summed per function, inclusive, per process: a
share of that process's busy samples and milliseconds per deletion.

    .venv/bin/python -m bench.profile_update [--n 100000] [--deletions 30]
        [--method output_perturbation] [--mode embedded|distributed] [--gil]
        [--out update_profile]

With `--gil` only samples of the thread holding the interpreter lock count: Python's CPU,
without the time a thread waits on PostgreSQL or Redis.

Writes bench/results/<out>.json: POST→certificate per deletion and each process's top
functions.
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

from bench.common import write_result
from bench.profile_request import busy_shares
from bench.resident import MODES, deployment, trained_model

RATE = 250  # samples per second


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--deletions", type=int, default=30)
    parser.add_argument("--method", default="output_perturbation")
    parser.add_argument("--mode", choices=MODES, default="embedded")
    parser.add_argument("--gil", action="store_true", help="only the thread holding the GIL")
    parser.add_argument("--out", default="update_profile")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with deployment(tmp / "lethe", args.mode, resident=2) as (c, cluster):
            ds_id, _, ids = trained_model(c, args.method, args.n, args.deletions + 3)
            for sample in ids[:3]:  # warm: these are not sampled
                c.wait_deletion(c.delete(ds_id, [sample]).id)
            assert cluster.api is not None
            pids = {"api": cluster.api.pid} | {
                f"worker{i}": w.pid for i, w in enumerate(cluster.workers)
            }
            spies = {
                name: subprocess.Popen(
                    [spy, "record", "--pid", str(pid), "-r", str(RATE), "--format", "raw"]
                    + ["--threads", "-o", str(tmp / f"{name}.txt")]
                    + (["--gil"] if args.gil else []),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                for name, pid in pids.items()
            }
            time.sleep(1.0)
            seconds = []
            for sample in ids[3:]:
                t0 = time.perf_counter()
                done = c.wait_deletion(c.delete(ds_id, [sample]).id)
                seconds.append(time.perf_counter() - t0)
                assert done.status == "done"
            for proc in spies.values():
                proc.send_signal(signal.SIGINT)
            for proc in spies.values():
                proc.wait(timeout=60)
        processes = {}
        for name in pids:
            total, shares = busy_shares(tmp / f"{name}.txt", top=200)
            per_deletion = 1000.0 / RATE / len(seconds)
            processes[name] = {
                "busy_samples": total,
                "busy_ms_per_deletion": total * per_deletion,
                "inclusive": [
                    {"function": f, "share": s, "ms_per_deletion": s * total * per_deletion}
                    for f, s in shares
                ],
            }
    result = {
        "n": args.n,
        "method": args.method,
        "mode": args.mode,
        "gil_only": args.gil,
        "rate_hz": RATE,
        "post_to_certificate_s": seconds,
        "p50_post_to_certificate_s": statistics.median(seconds),
        "processes": processes,
    }
    print(f"p50 POST→certificate {result['p50_post_to_certificate_s']:.3f} s")
    for name, p in processes.items():
        print(f"== {name}: {p['busy_ms_per_deletion']:.1f} busy ms per deletion")
        for row in p["inclusive"][:40]:
            print(f"{row['share']:6.1%} {row['ms_per_deletion']:6.2f} ms {row['function']}")
    print("wrote", write_result(args.out, result))


if __name__ == "__main__":
    main()
