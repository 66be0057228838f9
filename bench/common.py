"""Helpers for benchmarks: start a real `lethe serve`, percentiles, JSON results."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from bench.cluster import Cluster

RESULTS = Path(__file__).resolve().parent / "results"


@contextmanager
def embedded_server(data_dir: Path) -> Iterator[tuple[str, str]]:
    """Run `lethe serve` on a fresh SQLite file (embedded mode); yield (url, admin key)."""

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


def model_spec(arch: dict, training: dict, method: dict, n_features: int, n_classes: int):
    """A typed ModelSpec from the JSON a bench writes down (tests/factories.py)."""
    from tests.factories import model_spec as build

    return build(arch, method, n_features, n_classes, training)


def update_inputs(spec, state, removed, retained, target, test=None):
    """UpdateInputs for a bench that calls a method directly (no service, empty lineage)."""
    from tests.factories import update_inputs as build

    return build(spec, state, removed, retained, target=target, test=test or retained, model_id=0)
