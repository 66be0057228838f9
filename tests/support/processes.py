"""A process's children, read from /proc: `lethe serve`'s worker processes among them."""

from __future__ import annotations

import contextlib
from pathlib import Path


def children(pid: int) -> list[int]:
    """The live child processes of `pid` (/proc/PID/task/*/children): `lethe serve`'s
    embedded worker process, and multiprocessing's resource tracker."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that ended meanwhile
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def worker_processes(api: int) -> list[int]:
    """The pids of `lethe serve`'s embedded worker processes (one while it runs; none with
    the worker a thread), told from multiprocessing's resource tracker by their command line."""
    found = []
    for child in children(api):
        with contextlib.suppress(FileNotFoundError):
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found
