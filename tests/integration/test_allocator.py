"""`lethe serve`'s allocator settings (app/core/allocator.py): added once, others kept."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.allocator import NO_THREAD_CACHE, children_environment, scrubbing_environment
from tests.support.cluster import LETHE, free_port, wait_for


def test_the_settings_are_added_to_what_is_there_and_only_once() -> None:
    first = scrubbing_environment({"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert first is not None
    assert first["PATH"] == "/bin" and first["PYTHONMALLOC"] == "malloc"
    assert first["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{NO_THREAD_CACHE}"
    assert scrubbing_environment(first) is None  # the restarted process does not restart
    assert scrubbing_environment({})["GLIBC_TUNABLES"] == NO_THREAD_CACHE  # type: ignore[index]
    # PYTHONMALLOC set otherwise (pymalloc's debug hooks, say) is replaced
    assert scrubbing_environment({**first, "PYTHONMALLOC": "pymalloc"}) is not None


def test_the_children_get_the_environment_as_it_was() -> None:
    before = {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    restarted = scrubbing_environment(before)
    assert restarted is not None
    assert children_environment(restarted) == before
    assert children_environment({"PATH": "/bin"}) == {"PATH": "/bin"}


@pytest.mark.integration
def test_a_server_restarts_before_the_cli_is_imported(tmp_path: Path) -> None:
    """`lethe serve` (app/launch.py) restarts on the scrubbing allocator before the CLI and
    its libraries are imported, and once: they are imported once, by the restarted process
    (the restart had imported them twice), and it serves."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    env["LETHE_DATA_DIR"] = str(tmp_path / "data")
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            [sys.executable, "-X", "importtime", *LETHE[1:], "serve", "--port", str(port)],
            stdout=out,
            stderr=out,
            env=env,
        )
    try:
        wait_for(f"http://127.0.0.1:{port}/healthz", timeout=120)
        started = Path(f"/proc/{server.pid}/environ").read_bytes().split(b"\0")
        assert b"PYTHONMALLOC=malloc" in started  # the process serving is the restarted one
    finally:
        server.terminate()
        server.wait(timeout=60)
    imported = [
        name for name in re.findall(r"\|\s*(\S+)$", log.read_text(), re.MULTILINE)
        if name in ("typer", "app.cli", "app.main")
    ]  # fmt: skip
    assert sorted(imported) == ["app.cli", "app.main", "typer"]
