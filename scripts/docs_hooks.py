"""MkDocs hooks: figures rendered from bench/results/ and the API reference from the OpenAPI
document, at build time, so no figure is typed into the docs (mkdocs.yml `hooks:`).

In a page:
- `{{ figure "append.json" "learn_compute_s" "{:.2f} s" }}`: one value of a result;
- `{{ results "append.json" }}`: a result's measured values as a table, with its machine;
- `{{ api_reference }}`: every route of the API with its roles' summary and its answers.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
DIRECTIVE = re.compile(r"\{\{\s*(figure|results|api_reference)((?:\s+\"[^\"]*\")*)\s*\}\}")
MAX_ROWS = 40


class MissingResult(ValueError):
    """A page names a result or a value that bench/results/ does not hold."""


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each directive of a page with what it renders."""

    def render(match: re.Match[str]) -> str:
        kind, args = match.group(1), shlex.split(match.group(2) or "")
        if kind == "figure":
            return figure(*args)
        if kind == "results":
            return results(*args)
        return api_reference()

    return DIRECTIVE.sub(render, markdown)


def load(name: str) -> dict[str, Any]:
    path = RESULTS / name
    if not path.is_file():
        raise MissingResult(f"bench/results/{name} does not exist")
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def value_at(result: dict[str, Any], dotted: str) -> Any:
    here: Any = result
    for part in dotted.split("."):
        if isinstance(here, list):
            here = here[int(part)]
        elif isinstance(here, dict) and part in here:
            here = here[part]
        else:
            raise MissingResult(f"no value at {dotted!r}")
    return here


def figure(name: str, dotted: str, form: str = "{}") -> str:
    """One measured value, formatted, linked to its result file."""
    return f"{form.format(value_at(load(name), dotted))}"


def machine_line(result: dict[str, Any]) -> str:
    machine = result.get("machine") or {}
    parts = [f"{machine['cpus']} cores" if "cpus" in machine else None]
    parts += [machine.get("cpu"), machine.get("platform")]
    load = machine.get("load")
    if load:
        parts.append("load " + " / ".join(f"{v:.1f}" for v in load))
    when = result.get("measured_at")
    described = ", ".join(p for p in parts if p) or "the machine was not recorded"
    return f"*Measured {('on ' + when[:10]) if when else ''} — {described}.*"


def results(name: str) -> str:
    """A result's numbers as a table (at most MAX_ROWS; the file holds the rest)."""
    result = load(name)
    rows = [(k, v) for k, v in leaves(result) if not k.startswith(("machine", "measured_at"))]
    lines = ["| measured | value |", "|---|---|"]
    for key, value in rows[:MAX_ROWS]:
        lines.append(f"| `{key}` | {shown(value)} |")
    more = len(rows) - MAX_ROWS
    tail = f"\n\n{more} more in `bench/results/{name}`." if more > 0 else ""
    return f"{machine_line(result)}\n\n" + "\n".join(lines) + tail


def leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        out: list[tuple[str, Any]] = []
        for key, inner in value.items():
            out += leaves(inner, f"{prefix}{key}.")
        return out
    if isinstance(value, list):
        if value and all(isinstance(v, int | float) for v in value) and len(value) <= 8:
            return [(prefix.rstrip("."), value)]
        out = []
        for i, inner in enumerate(value[:4]):
            out += leaves(inner, f"{prefix}{i}.")
        return out
    return [(prefix.rstrip("."), value)]


def shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(shown(v) for v in value)
    return str(value).replace("|", "\\|")


def api_reference() -> str:
    """Every route of the OpenAPI document: method, path, summary, and the answers it gives."""
    import tempfile

    from app.core.settings import Settings
    from app.main import create_app

    with tempfile.TemporaryDirectory() as scratch:
        spec = create_app(Settings(data_dir=Path(scratch), bootstrap_admin_key=False)).openapi()
    lines = []
    for path, operations in sorted(spec["paths"].items()):
        for method, op in operations.items():
            codes = ", ".join(sorted(op.get("responses", {})))
            summary = (op.get("description") or op.get("summary") or "").split("\n")[0]
            lines.append(f"| `{method.upper()} {path}` | {summary.replace('|', '/')} | {codes} |")
    head = "| route | what | answers |\n|---|---|---|"
    return head + "\n" + "\n".join(lines)


def on_post_build(config: Any) -> None:
    """The benches' plots, beside the pages that show them (`figures/<name>.png`)."""
    import shutil

    target = Path(config["site_dir"]) / "figures"
    target.mkdir(parents=True, exist_ok=True)
    for plot in RESULTS.glob("*.png"):
        shutil.copy(plot, target / plot.name)
