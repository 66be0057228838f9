"""Helpers for benchmarks: start a real `lethe serve`, percentiles, JSON results."""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def embedded_server(data_dir: Path) -> Iterator[tuple[str, str]]:
    """Run `lethe serve` on a fresh SQLite file (embedded mode); yield (url, admin key)."""
    from bench.cluster import Cluster

    with Cluster(data_dir, None, None) as cluster:
        yield cluster.start_api(), cluster.admin_key


def percentiles(values: list[float]) -> dict[str, float]:
    arr = np.asarray(values)
    return {
        "n": len(values),
        "p50": float(np.percentile(arr, 50)),
        "p90": float(np.percentile(arr, 90)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(arr.mean()),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    result = {
        **result,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path
