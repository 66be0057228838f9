"""The way in stays short and the words stay for the reader: the README's quick start on its
first screen, no tracker references in the product, a bench that lists what it measures, and
docs whose figures come from results (the site's strict build runs in `make lint`)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("app", "workers", "methods", "maths", "architectures", "lethe", "clients", "migrations")
TRACKER = re.compile(r"\b[Ii]ssues?\s+(?:#\s*)?\d+")  # across a line break too


def test_the_readme_is_short_and_starts_the_user_on_its_first_screen() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300
    first_screen = "\n".join(lines[:45])
    for needed in ("make serve", "127.0.0.1:8000", "admin API key", "/ui", "/v1/deletions"):
        assert needed in first_screen, needed


def test_no_tracker_reference_in_the_product() -> None:
    """The product's files (as git tracks them: not a build's copies) name no tracker issue;
    a decision worth keeping links its design note (docs/design/)."""
    listed = subprocess.run(
        ["git", "ls-files", *PRODUCT, "scripts", "Makefile", "Dockerfile", "docker-compose.yml"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    found = []
    for name in listed:
        path = ROOT / name
        if path.suffix in (".py", ".js", ".html", ".css", ".sh", ".yml", "") and path.is_file():
            text = path.read_text(errors="replace")
            found += [f"{name}: {m.group(0)}" for m in TRACKER.finditer(text)]
    assert found == []


def test_docs_link_no_tracker_and_type_no_result_figures() -> None:
    """Figures are `{{ figure }}` / `{{ results }}` directives rendered from bench/results/;
    the performance page holds no typed number of its own."""
    docs = ROOT / "docs"
    assert not [p for p in docs.rglob("*.md") if TRACKER.search(p.read_text())]
    performance = (docs / "performance.md").read_text()
    prose = re.sub(r"\{\{.*?\}\}|`[^`]*`|<img[^>]*>|\([^)]*\)", "", performance)
    assert not re.search(r"\d+(\.\d+)? ?(ms|s|MB|MiB|×)\b", prose)


def test_the_bench_lists_its_suites_and_each_one_runs_a_module() -> None:
    from bench.__main__ import SUITES

    listed = subprocess.run(
        [sys.executable, "-m", "bench", "--list"], cwd=ROOT, capture_output=True, text=True
    )
    assert listed.returncode == 0 and all(name in listed.stdout for name in SUITES)
    for suite in SUITES.values():
        module = __import__(suite.module, fromlist=["main"])
        assert callable(module.main), suite.module
    modules = [p for p in (ROOT / "bench").glob("*.py")]
    assert len(modules) <= 25, sorted(p.name for p in modules)
    unknown = subprocess.run([sys.executable, "-m", "bench", "nope"], cwd=ROOT, capture_output=True)
    assert unknown.returncode == 2


@pytest.mark.parametrize("name", ["update_path.json", "convex_head.json", "append.json"])
def test_a_result_renders_with_its_machine(name: str) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_hooks

    table = docs_hooks.results(name)
    assert "cores" in table.splitlines()[0] and "| `" in table


def test_every_docs_page_the_product_names_exists() -> None:
    listed = subprocess.run(
        ["git", "ls-files", *PRODUCT, "scripts"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    named = {
        m.group(0)
        for name in listed
        if name.endswith(".py")
        for m in re.finditer(r"docs/[a-z0-9/_-]+\.md", (ROOT / name).read_text())
    }
    assert named and not [n for n in named if not (ROOT / n).is_file()]
