"""Stage marks for `bench/stages.py`: imported by a `sitecustomize` that the bench puts on the
service processes' PYTHONPATH, it wraps a few functions of the API and the worker as their
modules are imported, and appends `time pid label` lines to the file named by
$BENCH_STAGE_LOG. The product has no tracing of its own; nothing here runs outside the bench.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# module -> (function, label at its start, label at its end or None), in the order a warm
# single-sample deletion passes them
MARKS: dict[str, list[tuple[str, str, str | None]]] = {
    "app.api.deletions": [
        ("preferred_wait", "api.enter", None),  # the POST route's first call
        ("long_poll", "api.accepted", "api.answered"),  # after its commit; until finished
    ],
    "workers.linger": [("Linger.claim", "w.claim", "w.claimed")],
    "workers.jobs": [
        ("_compute", "w.compute", "w.stored"),  # the update, its metrics and its blobs
    ],
    "workers.load": [("load_batch", "w.load", "w.loaded")],
    "workers.commit": [
        ("commit_update", "w.commit", "w.commit_sent"),  # its statements, before COMMIT
    ],
    "app.wakeups": [("Announcer.announce", "w.committed", None)],  # right after COMMIT
}
ORDER = [
    "client.post",
    "api.enter",
    "api.accepted",
    "w.claim",
    "w.claimed",
    "w.load",
    "w.loaded",
    "w.compute",
    "w.stored",
    "w.commit",
    "w.commit_sent",
    "w.committed",
    "api.answered",
    "client.done",
]


def mark(label: str) -> None:
    """Append one line: wall-clock seconds (one clock for all processes), pid, label."""
    line = f"{time.time():.6f} {os.getpid()} {label}\n".encode()
    fd = os.open(os.environ["BENCH_STAGE_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _wrapped(fn: Callable[..., Any], start: str, end: str | None) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def marked_async(*args: Any, **kwargs: Any) -> Any:
            mark(start)
            try:
                return await fn(*args, **kwargs)
            finally:
                if end:
                    mark(end)

        return marked_async

    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        mark(start)
        try:
            return fn(*args, **kwargs)
        finally:
            if end:
                mark(end)

    return marked


def _patch(module: ModuleType, marks: Sequence[tuple[str, str, str | None]]) -> None:
    for path, start, end in marks:  # a function that is not there (renamed) is not marked
        owner: Any = module
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        if owner is not None and callable(getattr(owner, name, None)):
            setattr(owner, name, _wrapped(getattr(owner, name), start, end))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the marked modules through the other finders, then patches each once it ran."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in MARKS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            return None
        loader, marks = spec.loader, MARKS[name]
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module, marks)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    if os.environ.get("BENCH_STAGE_LOG") and not any(
        isinstance(f, _AfterImport) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _AfterImport())
