"""Where a job's time went, phase by phase, for its log line (a learned version's, an
append's): seconds since the previous mark. Nothing here is published."""

from __future__ import annotations

import time


class Phases:
    """Seconds since the last mark, by phase (a phase marked twice adds up)."""

    def __init__(self) -> None:
        self.took: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.took[phase] = self.took.get(phase, 0.0) + now - self._last
        self._last = now

    def __str__(self) -> str:
        return ", ".join(f"{phase} {seconds:.3f} s" for phase, seconds in self.took.items())
