"""Helpers for benchmarks: start a real `lethe serve`, percentiles, JSON results."""

from __future__ import annotations

import json
import os
import platform
import re
import socket
import subprocess
import sys
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
def embedded_server(
    data_dir: Path,
    env: dict[str, str] | None = None,
) -> Iterator[tuple[str, str]]:
    """Run `lethe serve` on a fresh SQLite file; yield (url, admin key)."""
    port = free_port()
    log = data_dir / "serve.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "LETHE_DATA_DIR": str(data_dir), **(env or {})}
    with log.open("w") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port)],
            stdout=fh,
            stderr=fh,
            env=full_env,
        )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            text = log.read_text()
            match = re.search(r"lethe_adm_[A-Za-z0-9_-]+", text)
            if match and "Application startup complete" in text:
                yield f"http://127.0.0.1:{port}", match.group(0)
                return
            if proc.poll() is not None:
                raise RuntimeError(text)
            time.sleep(0.1)
        raise RuntimeError("server did not start")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
