"""The OpenAPI document is the contract: Schemathesis (4.x) fuzzes a real `lethe serve` from
its /openapi.json with every check, a fixed seed and a small example budget.

`--checks all` includes status-code, content-type, response-header and response-schema
conformance, negative data rejected, positive data accepted (where tests/schemathesis.toml
names the semantic 422s a JSON schema cannot express), no 5xx, Allow on 405, use after free.
To reproduce by hand: start `lethe serve`, then
    schemathesis --config-file tests/schemathesis.toml run http://127.0.0.1:8000/openapi.json \\
        --checks all -H "Authorization: Bearer $KEY" --seed 1 --max-examples 30
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import Cluster

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).with_name("schemathesis.toml")
ROOT = Path(__file__).resolve().parents[2]
SEED = 1
MAX_EXAMPLES = 10  # per operation and phase: about a minute on two cores


def wait_until_serving(url: str, timeout: float = 30.0) -> None:
    """`lethe serve` logs startup before uvicorn binds its socket."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(f"{url}/healthz", timeout=2.0).raise_for_status()
            return
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


# The operations in three parts, each fuzzed against a server of its own, so that the suite's
# processes share the work; together they are every operation of the document.
PARTS = {
    "datasets": ["--include-path-regex", "^/v1/(datasets|formats)"],
    "models": ["--include-path-regex", "^/v1/models"],
    "the rest": ["--exclude-path-regex", "^/v1/(datasets|formats|models)"],
}


@pytest.mark.timeout(720)  # above the run's own 600 s guard (300 s ran out under the suite)
@pytest.mark.long
@pytest.mark.parametrize("part", list(PARTS))
def test_api_conforms_to_its_openapi_document(tmp_path: Path, part: str) -> None:
    pytest.importorskip("schemathesis")
    # small datasets only: the fuzzer asks for the largest synthetic dataset the schema allows
    with Cluster(
        tmp_path / "data", None, None, torch_threads=1, max_dataset_samples=5000
    ) as cluster:
        url = cluster.start_api()
        wait_until_serving(url)
        with cluster.client() as c:  # something for the dataset routes to find
            assert c.post("/v1/datasets", json={"builtin": "breast_cancer"}).status_code == 201
        command = [
            sys.executable,
            "-m",
            "tests.support.serial_ast",  # its two workers' threads parse at once (see there)
            "schemathesis.cli",
            "--config-file",
            str(CONFIG),
            "--no-color",
            "run",
            f"{url}/openapi.json",
            "--checks",
            "all",
            "--header",
            f"Authorization: Bearer {cluster.admin_key}",
            "--seed",
            str(SEED),
            "--max-examples",
            str(MAX_EXAMPLES),
            "--workers",
            "2",  # two operations at a time: the server waits on SQLite often (137 s → ?)
            "--generation-database",
            "none",  # no example database: the same seed gives the same run
            "--request-timeout",
            "40",  # above the longest long poll, GET /v1/deletions/{id}?wait=30
            # `--checks all` holds every answer to 10 s (ST112): a wall-clock budget that the
            # full suite on two cores ran past (GET /v1/privacy/methods, 11.1 s); a response
            # is held to the request's timeout instead
            "--max-response-time",
            "40",
            *PARTS[part],
        ]
        # cwd: Schemathesis keeps a crash cache (.schemathesis/) in the working directory;
        # the timeout guards a hang (240 s ran out on a slow machine under the full suite)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}  # tests.support from the run's folder
        result = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
    report = result.stdout[-30_000:] + result.stderr[-5_000:]
    assert result.returncode == 0, report
    assert "passed" in result.stdout and " failed" not in result.stdout, report
