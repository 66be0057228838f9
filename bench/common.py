"""Helpers for benchmarks: start a real `lethe serve`, percentiles, JSON results."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.cluster import Cluster
from tests.support.processes import children, worker_processes

RESULTS = Path(__file__).resolve().parent / "results"
REDIS = "redis://127.0.0.1:6379/0"  # the local server; each Cluster uses a queue of its own


@contextmanager
def scratch_database(prefix: str = "lethe_bench", migrate: bool = True) -> Iterator[str]:
    """A PostgreSQL database of the bench's own on the local server (migrated to head unless
    `migrate` is False), dropped afterwards; yields its URL."""
    from tests.support.databases import own_database

    with own_database(prefix, migrate) as url:
        yield url


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process so far, all its threads (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def embedded_worker(api: int) -> int | None:
    """The pid of `lethe serve`'s embedded worker process (None: a thread, or not started)."""
    return next(iter(worker_processes(api)), None)


def children_cpu_seconds(pid: int) -> float:
    """The CPU so far of the live children of `pid` (0 when it has none)."""
    total = 0.0
    for child in children(pid):
        with contextlib.suppress(FileNotFoundError):  # it ended since it was listed
            total += cpu_seconds(child)
    return total


@contextmanager
def embedded_server(data_dir: Path) -> Iterator[tuple[str, str]]:
    """Run `lethe serve` on a fresh SQLite file (embedded mode); yield (url, admin key)."""

    with Cluster(data_dir, None, None) as cluster:
        yield cluster.start_api(), cluster.admin_key


def ready(client: Any, answer: Any) -> dict[str, Any]:
    """A registered dataset once it is ready: a registration of more than 10,000 rows is a
    job (202), followed here until its status is ready. `client` is Lethe's Client
    or an httpx.Client, `answer` what its POST returned."""
    found = answer.json() if hasattr(answer, "json") and not isinstance(answer, dict) else answer
    while found.get("status") == "registering":
        time.sleep(0.2)
        got = client.get(f"/v1/datasets/{found['id']}")
        found = got.json() if hasattr(got, "json") and not isinstance(got, dict) else got
    if found.get("status") != "ready":
        raise RuntimeError(f"registration failed: {found}")
    return found


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


def run_in_tree(tree: Path, module: str, args: list[str]) -> tuple[str, dict[str, Any]]:
    """`python -m <module> --one <args>` with `tree` first on the path (a bench comparing two
    source trees side by side): the tree's short commit and the JSON its last line printed."""
    import subprocess
    import sys

    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", module, "--one", *args]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{module} in {tree} failed:\n{done.stderr[-4000:]}")
    return commit, json.loads(done.stdout.strip().splitlines()[-1])


def alternating(names: Sequence[str], runs: int) -> Iterator[tuple[int, str]]:
    """(run, name) for each of `names` once a run, in order on even runs and reversed on odd
    ones: side by side in one run, none always first (a warm or busy machine favours no one)."""
    for run in range(runs):
        for name in names if run % 2 == 0 else list(reversed(names)):
            yield run, name


def write_result(name: str, result: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    result = {
        **result,
        "machine": machine(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def machine() -> dict[str, Any]:
    """What a result was measured on: cores, CPU model, platform, and the load averages at the
    end of the run (a busy machine moves every figure)."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu or platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load": [round(v, 2) for v in os.getloadavg()],
    }


def device_info(device: str) -> dict[str, Any]:
    """What a bench computed on: the device, torch and, for a GPU, its name and memory."""
    import torch

    where = torch.device(device)
    info: dict[str, Any] = {
        "device": str(where),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
    }
    if where.type == "cuda":
        info |= {
            "gpu": torch.cuda.get_device_name(where),
            "cuda": torch.version.cuda,
            "gpu_memory_gib": torch.cuda.get_device_properties(where).total_memory / 2**30,
        }
    return info


def model_spec(arch: dict, training: dict, method: dict, n_features: int, n_classes: int):
    """A typed ModelSpec from the JSON a bench writes down (tests/support/factories.py)."""
    from tests.support.factories import model_spec as build

    return build(arch, method, n_features, n_classes, training)


def update_inputs(spec, state, removed, retained, target, test=None):
    """UpdateInputs for a bench that calls a method directly (no service, empty lineage)."""
    from tests.support.factories import update_inputs as build

    return build(spec, state, removed, retained, target=target, test=test or retained, model_id=0)
