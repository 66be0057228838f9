"""The benches never run in the suite (they are measurements, not tests), so a helper moved
from one bench module to another left four of them failing at import for a stop: every module
under bench/ must at least import."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

MODULES = sorted(
    p.stem
    for p in (Path(__file__).resolve().parents[2] / "bench").glob("*.py")
    if p.stem != "__init__"
)


@pytest.mark.parametrize("module", MODULES)
def test_every_bench_module_imports(module: str) -> None:
    importlib.import_module(f"bench.{module}")
