"""Where a warm single-sample deletion's wall time goes, stage by stage (issue 28, goal 3).

The service as `bench.scaling` runs it (bench/resident.py: LETHE_RESIDENT_MODELS=2, one torch
thread; embedded, or distributed with one `lethe worker`), with `bench/stage_marks.py`
loaded into its processes through a `sitecustomize` on their PYTHONPATH: the POST's entry,
its commit, the worker's claim, load, compute-and-store, commit statements and COMMIT, and
the answer are marked with one wall clock. `--deletions` sequential single-sample deletions
(`Prefer: wait`, one round trip each) after three that warm the session; for each stage, the
median and mean of its milliseconds, and the median POST→certificate.

    .venv/bin/python -m bench.stages [--mode embedded|embedded-thread|distributed] [--n 10000]
        [--method output_perturbation] [--deletions 30] [--out stages]

Writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import stage_marks
from bench.common import write_result
from bench.resident import EMBEDDED_THREAD, MODES, deployment, trained_model

ROOT = Path(__file__).resolve().parents[1]


def stages(log: Path, windows: list[tuple[float, float]]) -> dict[str, Any]:
    """Per deletion, the first time each label was marked inside its POST→answer window;
    then, for each pair of consecutive labels both marked, the milliseconds between them."""
    marks = [line.split() for line in log.read_text().splitlines()]
    per: list[dict[str, float]] = []
    for start, end in windows:
        seen: dict[str, float] = {"client.post": start, "client.done": end}
        for stamp, _, label in marks:
            at = float(stamp)
            if start <= at <= end and label not in seen:
                seen[label] = at
        per.append(seen)
    labels = [label for label in stage_marks.ORDER if all(label in s for s in per)]
    out: dict[str, Any] = {}
    for a, b in zip(labels, labels[1:], strict=False):
        ms = [1000 * (s[b] - s[a]) for s in per]
        out[f"{a} → {b}"] = {"p50_ms": statistics.median(ms), "mean_ms": statistics.mean(ms)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=(*MODES, EMBEDDED_THREAD), default="distributed")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--method", default="output_perturbation")
    parser.add_argument("--deletions", type=int, default=30)
    parser.add_argument("--out", default="stages")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        site = tmp / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(
            "from bench import stage_marks\n\nstage_marks.install()\n"
        )
        log = tmp / "stages.log"
        os.environ["BENCH_STAGE_LOG"] = str(log)  # the service inherits both
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(site), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        with deployment(tmp / "lethe", args.mode, resident=2) as (c, _):
            ds_id, _, ids = trained_model(c, args.method, args.n, args.deletions + 3)
            for sample in ids[:3]:  # warm the session; not counted
                c.delete(ds_id, [sample], wait=20)
            windows: list[tuple[float, float]] = []
            for sample in ids[3 : 3 + args.deletions]:
                start = time.time()
                done = c.delete(ds_id, [sample], wait=20)
                windows.append((start, time.time()))
                assert done.status == "done", done
        result = stages(log, windows)
    total = statistics.median(1000 * (b - a) for a, b in windows)
    print(f"{args.mode} n={args.n} {args.method}: p50 POST→certificate {total:.1f} ms")
    for stage, figures in result.items():
        print(f"  {stage:32s} p50 {figures['p50_ms']:6.2f} ms   mean {figures['mean_ms']:6.2f}")
    write_result(
        args.out,
        {
            "mode": args.mode,
            "n": args.n,
            "method": args.method,
            "deletions": args.deletions,
            "p50_post_to_certificate_ms": total,
            "stages": result,
        },
    )


if __name__ == "__main__":
    main()
