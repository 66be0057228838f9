"""The allocator `lethe serve` runs on: every freed block overwritten.

glibc overwrites what it frees once asked (`mallopt(M_PERTURB)`, app/core/services/isolated.py),
but two caches sit in front of it and keep freed blocks as they were: Python's small-object
pools (every object of ≤ 512 bytes: a deletion body's bytes, the ids parsed from it, the
JSON strings of its answer) and glibc's per-thread cache. Which freed block is reused next
depends on what else runs, so an erased person's id stayed in the API's free memory on a
loaded machine and not on a quiet one. `lethe serve` therefore starts again, once, on glibc's
malloc for every object (`PYTHONMALLOC=malloc`) with the per-thread cache off
(`glibc.malloc.tcache_count=0`): then each free goes through glibc and is overwritten.
Its children get the environment it was started with: an upload's child and the worker
process are short-lived by design (app/core/services/isolated.py, workers/recycle.py) and parse on
Python's faster allocator (a 50,000-row upload took 26 % longer on glibc's).
"""

from __future__ import annotations

import json
import os
import platform
import sys

PYTHON_MALLOC = "malloc"
NO_THREAD_CACHE = "glibc.malloc.tcache_count=0"
ORIGINAL = "_LETHE_ALLOCATOR_ORIGINAL"  # the two variables as they were, for the children


def scrubbing_environment(environ: dict[str, str]) -> dict[str, str] | None:
    """`environ` with the two settings added, or None when it has them already."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    if environ.get("PYTHONMALLOC") == PYTHON_MALLOC and NO_THREAD_CACHE in tunables.split(":"):
        return None
    joined = f"{tunables}:{NO_THREAD_CACHE}" if tunables else NO_THREAD_CACHE
    was = {name: environ.get(name) for name in ("PYTHONMALLOC", "GLIBC_TUNABLES")}
    return {
        **environ,
        "PYTHONMALLOC": PYTHON_MALLOC,
        "GLIBC_TUNABLES": joined,
        ORIGINAL: json.dumps(was),
    }


def children_environment(environ: dict[str, str]) -> dict[str, str]:
    """`environ` of a restarted process as it was before the restart (what its children get)."""
    if ORIGINAL not in environ:
        return environ
    out = {name: value for name, value in environ.items() if name != ORIGINAL}
    for name, value in json.loads(environ[ORIGINAL]).items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = value
    return out


_restarted = False  # this process is the restarted one


def restart_scrubbing() -> None:
    """Replace this process (same pid, same command line) by one with every freed block
    overwritten, unless it is one already or the C library is not glibc (nothing to ask)."""
    global _restarted
    if _restarted or platform.libc_ver()[0] != "glibc":
        return
    environment = scrubbing_environment(dict(os.environ))
    if environment is None:  # restarted: the children start as this process was started
        restored = children_environment(dict(os.environ))
        os.environ.clear()
        os.environ.update(restored)
        _restarted = True  # asked again (app/launch.py, then `serve`): the restored
        return  # environment no longer says so, and it would restart once more
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, environment)
