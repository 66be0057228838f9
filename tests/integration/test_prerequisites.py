"""`make test`'s set-up step on a machine that lacks what the suite needs:
scripts/test-prerequisites, run where chromium and Go are missing, installs them with apt and
reports their versions; run again with everything present, it installs nothing. apt-get is a
stand-in that records what it is asked for and installs stand-ins, and PostgreSQL and Redis
answer through stand-ins: the step's own logic, not Debian's archive, is what is tested."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("bash", "sh", "seq", "sleep", "ls", "head", "id", "chmod", "cat", "env")


def executable(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_missing_chromium_and_go_are_installed_then_nothing_is(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"  # the only PATH: no chromium, no go on it
    bin_.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_ / tool).symlink_to(found)
    asked = tmp_path / "apt.log"
    executable(bin_ / "pg_isready", "exit 0")
    executable(bin_ / "redis-cli", "echo PONG")
    executable(
        bin_ / "apt-get",
        f'echo "$*" >> {asked}\n'
        'if [ "$1" = install ]; then for p in "$@"; do case "$p" in\n'
        f'  chromium) printf "#!/bin/sh\\necho Chromium 156-stand-in\\n" > {bin_}/chromium;;\n'
        f'  golang-go) printf "#!/bin/sh\\necho go version stand-in\\n" > {bin_}/go;;\n'
        f"esac; done; chmod +x {bin_}/chromium {bin_}/go 2>/dev/null; fi; exit 0",
    )

    def prerequisites() -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(bin_ / "bash"), str(ROOT / "scripts" / "test-prerequisites")],
            env={**os.environ, "PATH": str(bin_)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    first = prerequisites()
    calls = asked.read_text().splitlines()
    assert calls[0] == "update -qq"
    installed = calls[1].split()
    assert installed[:3] == ["install", "-y", "-qq"] and {"chromium", "golang-go"} <= set(installed)
    assert "Chromium 156-stand-in" in first.stdout and "go version stand-in" in first.stdout

    prerequisites()
    assert asked.read_text().splitlines() == calls  # nothing missing: apt is not asked again
