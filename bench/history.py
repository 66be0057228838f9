"""Does a deletion cost more as a model's history grows? (issue 28: a deletion should cost what
its maths costs, and that does not grow with the number of releases before it.)

For each method: a distributed deployment (`lethe serve`, one `lethe worker`, a fresh
PostgreSQL database, the local Redis; bench/resident.py's `deployment`), the builtin
synthetic dataset (n samples, 20 features, 2 classes), one model, then `--deletions`
sequential single-sample deletions. Per window of `--window` deletions: the median
POST→certificate, and the worker's and PostgreSQL's CPU milliseconds per deletion (from
/proc). The slope is the least-squares growth of the window medians, in milliseconds per 1,000
earlier deletions: flat is ~0.

    .venv/bin/python -m bench.history [--n 10000] [--deletions 1000] [--window 100]
        [--methods output_perturbation,sharded_retrain,recollection] [--out history]

Writes bench/results/<out>.json and .png.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import RESULTS, write_result
from bench.resident import cpu_now, deletion, deployment, trained_model


def slope_per_thousand(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs, per 1,000 of x."""
    return 1000 * statistics.linear_regression(xs, ys).slope


def run_method(method: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    with deployment(tmp / method, "distributed", resident=2) as (c, cluster):
        ds_id, model_id, ids = trained_model(c, method, args.n, args.deletions)
        windows: list[dict[str, Any]] = []
        for start in range(0, args.deletions, args.window):
            chunk = ids[start : start + args.window]
            before = cpu_now(cluster)
            rows = [deletion(c, ds_id, model_id, sample) for sample in chunk]
            after = cpu_now(cluster)
            window = {
                "first_deletion": start + 1,
                "deletions": len(rows),
                "p50_post_to_certificate_ms": 1000
                * statistics.median(r["post_to_certificate_s"] for r in rows),
                "cpu_ms_per_deletion": {
                    k: 1000 * (after[k] - before[k]) / len(rows) for k in ("workers", "postgres")
                },
            }
            windows.append(window)
            print(f"{method} deletions {start + 1}-{start + len(rows)}: {window}", flush=True)
            time.sleep(0.2)
    xs = [w["first_deletion"] + w["deletions"] / 2 for w in windows]
    return {
        "windows": windows,
        "slope_ms_per_1000_deletions": {
            "post_to_certificate_p50": slope_per_thousand(
                xs, [w["p50_post_to_certificate_ms"] for w in windows]
            ),
            "worker_cpu": slope_per_thousand(
                xs, [w["cpu_ms_per_deletion"]["workers"] for w in windows]
            ),
            "postgres_cpu": slope_per_thousand(
                xs, [w["cpu_ms_per_deletion"]["postgres"] for w in windows]
            ),
        },
    }


def plot(methods: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for method, out in methods.items():
        xs = [w["first_deletion"] for w in out["windows"]]
        ax.plot(xs, [w["p50_post_to_certificate_ms"] for w in out["windows"]], "o-", label=method)
        ax.plot(xs, [w["cpu_ms_per_deletion"]["workers"] for w in out["windows"]], "x:", label=None)
    ax.set_xlabel("deletions before the window")
    ax.set_ylabel("ms (o: POST→certificate p50; x: worker CPU per deletion)")
    ax.set_ylim(bottom=0)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--deletions", type=int, default=1000)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--methods", default="output_perturbation,sharded_retrain,recollection")
    parser.add_argument("--out", default="history")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        methods = {m: run_method(m, args, Path(tmp)) for m in args.methods.split(",")}
    write_result(args.out, {"n": args.n, "window": args.window, "methods": methods})
    plot(methods, RESULTS / f"{args.out}.png")


if __name__ == "__main__":
    main()
