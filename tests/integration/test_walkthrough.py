"""The docs' curl walkthrough runs top to bottom as written, against a fresh embedded service,
from a folder holding only the repository's verifier, and again against the same service; the
README's quick start runs as written too."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def readme_block(heading: str, page: str = "README.md") -> str:
    """The first bash block of a page (the README, or one under docs/) after `heading`."""
    text = (ROOT / page).read_text()
    section = text[text.index(heading) :]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def walkthrough() -> str:
    return readme_block("## Walkthrough with curl", "docs/getting-started.md")


def quick_start() -> str:
    """The README's one deletion, as written, but for the key and address the test gives."""
    block = readme_block("One deletion, start to certificate")
    return "\n".join(
        line for line in block.splitlines() if not line.startswith(("export KEY=", "L="))
    )


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
def test_the_walkthrough_runs_as_written_and_again(tmp_path: Path) -> None:
    work = tmp_path / "work"
    with Cluster(tmp_path / "data", None, None) as cluster:
        url = cluster.start_api()
        result = run_walkthrough(work, url, cluster.admin_key)
        again = run_walkthrough(tmp_path / "again", url, cluster.admin_key)  # same service
        quick = subprocess.run(  # the README's quick start, with the key it printed
            ["bash", "-c", "set -euo pipefail\n" + quick_start()],
            env={**os.environ, "KEY": cluster.admin_key, "L": url},
            capture_output=True, text=True, timeout=280, check=False,
        )  # fmt: skip
    assert quick.returncode == 0, f"{quick.stdout[-3000:]}\n{quick.stderr[-3000:]}"
    assert '"status": "done"' in quick.stdout and "certif" in quick.stdout
    assert '"status": "done"' in again.stdout
    out = result.stdout
    assert re.search(r"etag", out, re.I)
    assert '"status": "done"' in out and "410" in out.splitlines()
    assert '"ok": true' in out and '"role": "requester"' in out
    assert (work / "model.safetensors").stat().st_size > 0
    assert (work / "audit.jsonl").read_text().count("\n") >= 2
