"""The container image, built and run: `scripts/build-image` makes it with podman
from Debian's packages alone (no registry is reachable here), the image's healthcheck passes
once the service is up, and the README's curl walkthrough runs against the container as
written. Marked `image`: `make test-image` runs it (CI too); the suite (`make test`) does not,
the build alone taking minutes."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.test_walkthrough import run_walkthrough
from tests.support.cluster import free_port

# Its budget covers the image's build from Debian's packages (up to 1,800 s on a fresh machine)
# and the healthcheck and walkthrough after it, not the suite-wide 300 s.
pytestmark = [pytest.mark.image, pytest.mark.timeout(2400)]
ROOT = Path(__file__).resolve().parents[2]
TAG = "localhost/lethe:test"
# This VM has hybrid cgroups (v1 controllers and a v2 mount), which crun refuses, and no
# CAP_SYS_RESOURCE, so podman's default rlimits (above the host's) cannot be set: runc, and
# rlimits under the host's. A machine with cgroup v2 runs the image with neither.
RUN_OPTIONS = ("--runtime", "runc", "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096")


def podman(*args: str, timeout: float = 60, check: bool = True) -> str:
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def test_the_image_builds_from_debian_packages_passes_its_healthcheck_and_serves_the_walkthrough(
    tmp_path: Path,
) -> None:
    assert shutil.which("podman") and shutil.which("mmdebstrap"), "make test-image installs them"
    build = subprocess.run(
        [str(ROOT / "scripts" / "build-image"), TAG],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    port = free_port()
    name = f"lethe-test-{uuid.uuid4().hex[:8]}"
    podman(
        "run", "--detach", "--name", name, *RUN_OPTIONS, "--publish", f"127.0.0.1:{port}:8000", TAG
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # the image's own HEALTHCHECK command, as an orchestrator runs it
            health = subprocess.run(
                ["podman", "healthcheck", "run", name], capture_output=True, text=True, check=False
            )
            if health.returncode == 0:
                break
            assert time.monotonic() < deadline, podman("logs", name)[-3000:]
            time.sleep(1)
        user = podman("exec", name, "id", "-u").strip()
        assert user == "10001"  # unprivileged, as the Dockerfile says
        logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True, check=True)
        keys = re.findall(r"lethe_adm_[A-Za-z0-9_-]+", logs.stdout + logs.stderr)
        assert keys, "the first start prints an admin key once"
        result = run_walkthrough(tmp_path / "work", f"http://127.0.0.1:{port}", keys[0])
        assert '"status": "done"' in result.stdout and '"ok": true' in result.stdout
    finally:
        podman("rm", "--force", name, check=False)
