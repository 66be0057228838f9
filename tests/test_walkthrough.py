"""The README's curl walkthrough runs top to bottom as written, against a fresh embedded
service, from a folder holding only the repository's verifier (issue 16, part 7)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cluster import Cluster

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[1]


def readme_block(heading: str) -> str:
    """The first bash block of the README after `heading`, as written."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(heading) :]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def walkthrough() -> str:
    return readme_block("## Walkthrough with curl")


def run_walkthrough(work: Path, url: str, key: str) -> subprocess.CompletedProcess[str]:
    """The walkthrough against `url` with an admin `key`, in `work` holding only the verifier."""
    (work / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "verify_audit.py", work / "scripts")
    env = {**os.environ, "KEY": key, "L": url, "PY": sys.executable}
    result = subprocess.run(
        ["bash", "-c", walkthrough()],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.long
def test_the_readme_walkthrough_runs_as_written(tmp_path: Path) -> None:
    work = tmp_path / "work"
    with Cluster(tmp_path / "data", None, None) as cluster:
        result = run_walkthrough(work, cluster.start_api(), cluster.admin_key)
    out = result.stdout
    assert re.search(r"etag", out, re.I)
    assert '"status": "done"' in out and "410" in out.splitlines()
    assert '"ok": true' in out and '"role": "requester"' in out
    assert (work / "model.safetensors").stat().st_size > 0
    assert (work / "audit.jsonl").read_text().count("\n") >= 2
