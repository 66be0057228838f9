"""Where the API's time goes under load: py-spy samples `lethe serve` (embedded)
while wrk POSTs single-sample deletions with 16 connections, and the busy samples (threads
waiting on a queue, a condition or a socket left out) are summed per function, inclusive.

    .venv/bin/python -m bench.profile_request [--seconds 15] [--mode embedded|postgres]
        [--out request_profile]

Writes bench/results/<out>.json: the share of busy samples per function (top 60) and the
load's throughput; embedded, the API's worker process is sampled apart (`worker_*`). py-spy
is a test extra (`pip install py-spy`).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REDIS, embedded_worker, scratch_database, write_result
from bench.request_path import prepare, wrk
from tests.support.cluster import Cluster

IDLE_LEAVES = re.compile(
    r"^(wait|get|select|poll|epoll|accept|recv|read|sleep|acquire|_worker|run_forever)\b"
)
IDLE_FRAMES = ("Condition.wait", "Queue.get", "SimpleQueue.get", "Future.result", "Event.wait")


def frame_name(frame: str) -> str:
    """`func (path/to/file.py:12)` -> `func @file.py`."""
    match = re.match(r"(.*?) \((.*?):\d+\)$", frame)
    if not match:
        return frame
    return f"{match.group(1)} @{match.group(2).rsplit('/', 1)[-1]}"


def busy_shares(raw: Path, top: int = 60) -> tuple[int, list[tuple[str, float]]]:
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        names = [frame_name(f) for f in stack.split(";")[1:]]  # the first is the thread
        if not names or IDLE_LEAVES.match(names[-1]):
            continue
        if any(n.startswith(IDLE_FRAMES) for n in names[-3:]):
            continue
        total += int(count)
        for name in set(names):
            inclusive[name] += int(count)
    return total, [(name, n / total) for name, n in inclusive.most_common(top)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=15)
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--out", default="request_profile")
    parser.add_argument("--mode", choices=["embedded", "postgres"], default="embedded")
    args = parser.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        url, redis = None, None
        if args.mode == "postgres":  # the API alone is sampled; its worker is a process
            url, redis = stack.enter_context(scratch_database()), REDIS
        with Cluster(tmp / "lethe", url, redis, torch_threads=1) as cluster:
            base = cluster.start_api()
            if args.mode == "postgres":
                cluster.start_worker()
            p = prepare(cluster, args.samples, tmp)
            env = {
                "WRK_IDS": str(p["ids_file"]),
                "WRK_DATASET": str(p["dataset_id"]),
                "WRK_PATH": "/v1/deletions",
                "WRK_KEY": p["requester"],
            }
            assert cluster.api is not None
            sampled = {"api": cluster.api.pid}
            if (worker := embedded_worker(cluster.api.pid)) is not None:
                sampled["worker"] = worker  # embedded: the API's worker process, apart
            with cf.ThreadPoolExecutor(1 + len(sampled)) as pool:
                load = pool.submit(wrk, "deletions.lua", base, args.seconds, 16, env)
                time.sleep(1)
                spies = [
                    pool.submit(
                        subprocess.run,
                        [spy, "record", "--pid", str(pid), "-d", str(args.seconds - 3), "-r"]
                        + ["200", "--format", "raw", "--threads", "-o", str(tmp / f"{name}.txt")],
                        check=True,
                        capture_output=True,
                    )
                    for name, pid in sampled.items()
                ]
                for done in spies:
                    done.result()
                posts = load.result()
        profiles = {name: busy_shares(tmp / f"{name}.txt") for name in sampled}
    total, shares = profiles["api"]
    result = {"posts": posts, "busy_samples": total, "inclusive_share": shares}
    if "worker" in profiles:
        result["worker_busy_samples"], result["worker_inclusive_share"] = profiles["worker"]
    print(f"{posts['per_second']:.0f} POST/s, p99 {posts['p99_ms']:.0f} ms")
    for name, (busy, found) in profiles.items():
        print(f"{name}: {busy} busy samples")
        for function, share in found[:30]:
            print(f"{share:6.1%} {function}")
    print("wrote", write_result(args.out, result))


if __name__ == "__main__":
    main()
