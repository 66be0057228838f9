"""Reading a process's memory for given byte strings: /proc/<pid>/maps names the
mapped regions, /proc/<pid>/mem holds their bytes. Only writable regions are read (heap,
stacks, anonymous maps): read-only maps are the program's files, never a request's data."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

_REGION = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")


def writable_regions(pid: int) -> list[tuple[int, int, str]]:
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        found = _REGION.match(line)
        if found is None:
            continue
        start, end, perms, name = found.groups()
        if perms[0] == "r" and perms[1] == "w" and name not in ("[vvar]", "[vsyscall]"):
            out.append((int(start, 16), int(end, 16), name))
    return out


def scan(pid: int, needles: dict[str, bytes], chunk: int = 1 << 24) -> Counter[str]:
    """How many times each needle occurs in the process's writable memory."""
    hits: Counter[str] = Counter()
    longest = max(len(n) for n in needles.values())
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for start, end, _ in writable_regions(pid):
            at, tail = start, b""
            while at < end:
                size = min(chunk, end - at)
                try:
                    mem.seek(at)
                    block = mem.read(size)
                except (OSError, ValueError):
                    break
                data = tail + block
                for name, needle in needles.items():
                    hits[name] += data.count(needle)
                tail = data[-(longest - 1) :] if longest > 1 else b""
                at += size
    return hits
