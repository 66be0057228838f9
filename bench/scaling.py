"""POST→certificate against n, per method, with resident sessions (issue 28, goal 3).

The service (bench/resident.py's `run`, LETHE_RESIDENT_MODELS=2, one torch thread), embedded
(SQLite, inline worker) at `--sizes` and distributed (PostgreSQL, Redis, one worker process) at
`--distributed-sizes`, on synthetic samples × `--features` features, 2 classes: `--deletions`
sequential single-sample deletions per method. For each mode and method, the median
POST→certificate and compute per n, whether it is within the goal (≤ 1.5 × compute + 30 ms),
and the slope of log(POST→certificate) against log(n) fitted by least squares (0: flat in n;
1: linear). recollection only up to `--recollection-max` (100,000 by default: its training is
O(n²)).

    .venv/bin/python -m bench.scaling [--sizes 10000,100000,1000000]
        [--distributed-sizes 10000,100000] [--deletions 6] [--device cpu|cuda] [--out scaling]

Writes bench/results/<out>.json and <out>.png (log-log, a line per method and mode). With
`--device cuda` the worker computes on the GPU (LETHE_DEVICE=cuda) and keeps its sessions'
rows there.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import RESULTS, device_info, write_result
from bench.resident import EMBEDDED_THREAD, METHODS, MODES, run


def slope(ns: list[int], seconds: list[float]) -> float | None:
    if len(ns) < 2:
        return None
    fit = np.polyfit([math.log(n) for n in ns], [math.log(s) for s in seconds], 1)
    return float(fit[0])


def plot(modes: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours: dict[str, Any] = {}
    for mode, per_method in modes.items():
        style = "o-" if mode == "embedded" else "s--"
        for method, row in per_method.items():
            if not row["n"]:
                continue
            label = f"{method}, {mode}" + (
                f" (slope {row['slope']:.2f})" if row["slope"] is not None else ""
            )
            line = ax.loglog(
                row["n"], row["post_to_certificate_p50_s"], style, label=label,
                color=colours.get(method),
            )[0]  # fmt: skip
            colours[method] = line.get_color()
            if mode == "embedded":
                ax.loglog(row["n"], row["compute_p50_s"], "x:", color=colours[method])
    ax.set_xlabel("training samples n")
    ax.set_ylabel("seconds (POST→certificate p50; x: compute p50)")
    ax.set_title("Single-sample deletion with resident sessions: embedded (o) and distributed (s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def summary(methods: list[str], sizes: list[int], runs: dict[str, Any]) -> dict[str, Any]:
    """Per method: the medians per n, whether each is within the goal, and the fitted slopes."""
    per_method: dict[str, Any] = {}
    for method in methods:
        measured = [(n, runs[str(n)][method]) for n in sizes if "deletions" in runs[str(n)][method]]
        ns = [n for n, _ in measured]
        post = [m["p50_post_to_certificate_s"] for _, m in measured]
        per_method[method] = {
            "n": ns,
            "post_to_certificate_p50_s": post,
            "compute_p50_s": [m["p50_compute_s"] for _, m in measured],
            "plumbing_p50_s": [m["p50_plumbing_s"] for _, m in measured],
            "cpu_ms_per_deletion": [m.get("cpu_ms_per_deletion") for _, m in measured],
            "slope": slope(ns, post),
            "compute_slope": slope(ns, [max(m["p50_compute_s"], 1e-6) for _, m in measured]),
            "within_goal": [  # POST→certificate ≤ 1.5 × compute + 30 ms
                m["p50_post_to_certificate_s"] <= 1.5 * m["p50_compute_s"] + 0.030
                for _, m in measured
            ],
        }
    return per_method


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--distributed-sizes", default="10000,100000")
    parser.add_argument("--modes", default=",".join(MODES), help=f"also: {EMBEDDED_THREAD}")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--deletions", type=int, default=6)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--recollection-max", type=int, default=100_000)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", default="scaling", help="bench/results/<out>.json and .png")
    args = parser.parse_args()
    methods = args.methods.split(",")
    sizes = {
        "embedded": [int(s) for s in args.sizes.split(",")],
        "distributed": [int(s) for s in args.distributed_sizes.split(",")],
    }
    sizes[EMBEDDED_THREAD] = sizes["embedded"]  # the old worker thread, for comparison
    modes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            runs = {
                str(n): run(n, 2, methods, args, Path(tmp), mode, args.device) for n in sizes[mode]
            }
            modes[mode] = {
                "sizes": sizes[mode],
                "methods": summary(methods, sizes[mode], runs),
                "runs": runs,
            }
    result = {"features": args.features, "classes": 2, "device": device_info(args.device)}
    write_result(args.out, {**result, "modes": modes})
    plot({mode: m["methods"] for mode, m in modes.items()}, RESULTS / f"{args.out}.png")


if __name__ == "__main__":
    main()
