"""convex_head's removal loop on realistic and boundary cases (issue 52, goals 4 and 5): how
often a request is released, how often without any pass over the retained rows, and what the
true gradient was, for two source trees side by side in one run (today's code and another,
e.g. the commit before the change, checked out with `git worktree add`).

Cases (each trained to ‖∇F‖ ≤ 1e-10, then sequential single-sample removals through
`ConvexHead.unlearn` with the resident state carried as the job carries it; a request the
method cannot release restarts from the exact optimum, cold-solved here the same way in both
trees):
- `standardized`: 20,000 × 64 standardized tabular rows (make_classification, 5 classes),
  R = 1000 far above the largest row norm, λ = 1e-4, β = 1e-4 (λβ = 1e-8);
- `digits`: scikit-learn's digits / 16 (1,437 train rows × 64, 10 classes), R = 100,
  λ = 1e-3, β = 1e-5 (λβ = 1e-8);
- `embeddings`: 10,000 × 128 low-rank, heavy-tailed rows (4 classes), R = 50, λ = 1e-4,
  β = 1e-4;
- `boundary`: 10,000 × 32 near-separable rows (2 classes, class_sep 3), λ = 1e-5, R = 50,
  β = 1e-3; the removed rows are those of smallest margin under the trained state (the rows
  that hold the boundary);
- `boundary10`: the same with 10,000 × 64 rows of 10 classes (class_sep 2.5);
- `boundary257`: the issue's shape, 20,000 × 256 near-separable rows of 10 classes
  (class_sep 4, scaled by 1/4), λ = 1e-5, R = 20, β = 1e-3, default options.

The first request finds the resident state `prepare` made after training, as the pipeline
does; after a fallback the next request anchors afresh.

    .venv/bin/python -m bench.convex_branch [--other /tmp/before] [--requests 40]

And goal 4's divergence (`far_start`): one removal from a state far from the optimum, the
bound on ‖∇F‖ before and after the steps.

Writes bench/results/convex_branch.json: per tree and case, requests released (and released
with no pass), fallbacks, median passes and steps, and the largest true ‖∇F‖/λβ after a
released step (an independent float64 gradient, which must stay ≤ 1 for a sound bound).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

CASES = ("standardized", "digits", "embeddings", "boundary", "boundary10", "boundary257")


def _case(name: str) -> tuple[Any, Any, dict[str, float], str]:
    """Rows, labels, the method's options and how rows are picked for removal."""
    from sklearn import datasets as skd
    from sklearn.preprocessing import StandardScaler

    if name == "standardized":
        X, y = skd.make_classification(
            20_000, 64, n_informative=16, n_classes=5, n_clusters_per_class=2, random_state=1
        )
        X = StandardScaler().fit_transform(X)
        return X, y, {"lam": 1e-4, "R": 1000.0, "beta": 1e-4}, "random"
    if name == "digits":
        X, y = skd.load_digits(return_X_y=True)
        return X[:1437] / 16.0, y[:1437], {"lam": 1e-3, "R": 100.0, "beta": 1e-5}, "random"
    if name == "embeddings":
        rng = np.random.default_rng(3)
        basis = rng.standard_normal((16, 128))
        y = rng.integers(0, 4, 10_000)
        centres = rng.standard_normal((4, 16)) * 1.5
        codes = centres[y] + rng.standard_t(3, (10_000, 16))
        return codes @ basis / 8.0, y, {"lam": 1e-4, "R": 50.0, "beta": 1e-4}, "random"
    if name == "boundary257":  # the shape: 20,000 × 257 × 10, λ = 1e-5, defaults
        X, y = skd.make_classification(
            20_000, 256, n_informative=32, n_redundant=0, n_classes=10,
            n_clusters_per_class=1, class_sep=4.0, flip_y=0.0, random_state=5,
        )  # fmt: skip
        return X / 4.0, y, {"lam": 1e-5, "R": 20.0, "beta": 1e-3}, "boundary"
    if name == "boundary10":
        X, y = skd.make_classification(
            10_000, 64, n_informative=16, n_classes=10, class_sep=2.5, flip_y=0.0,
            random_state=4,
        )  # fmt: skip
        return X, y, {"lam": 1e-5, "R": 50.0, "beta": 1e-3}, "boundary"
    X, y = skd.make_classification(
        10_000, 32, n_informative=8, n_classes=2, class_sep=3.0, flip_y=0.0, random_state=2
    )
    return X, y, {"lam": 1e-5, "R": 50.0, "beta": 1e-3}, "boundary"


def run_case(name: str, requests: int) -> dict[str, Any]:
    """One case in this process's tree."""
    import torch

    from bench.common import model_spec
    from maths import convex
    from methods.compute import PrivacyTarget, TargetInfeasible
    from methods.convex_head.compute import ConvexHead, to_state, to_theta
    from tests.factories import update_inputs
    from workers.data import Arrays
    from workers.resident import ModelSession

    X, y, options, pick = _case(name)
    X32, y_t = torch.from_numpy(np.asarray(X, np.float32)), torch.from_numpy(np.asarray(y))
    n, p = X32.shape
    k = int(y_t.max()) + 1
    spec = model_spec(
        {"type": "logreg", "feature_norm": options["R"]},
        {},
        {"name": "convex_head", **options},
        p,
        k,
    )
    head = ConvexHead(spec)
    ids = list(range(n))
    rows = Arrays(ids, [str(i) for i in ids], X32, y_t, [None] * n)
    empty = Arrays([], [], X32[:0], y_t[:0], [])
    cpu = torch.device("cpu")
    session = ModelSession.of(0, 1, rows, {}, empty, cpu)
    _, whole = session.split([], {}, [])
    trained = head.train(whole)
    session = ModelSession.of(0, 1, rows, dict(trained.state), empty, cpu)
    _, whole = session.split([], {}, [])
    resident: object | None = head.prepare(whole, trained.state)  # as training leaves it
    if pick == "boundary":
        problem = convex.Problem.of(X32, y_t, k, options["R"], options["lam"])
        margins = (problem.T * (problem.Z @ to_theta(trained.state).T)).min(dim=1).values
        order = torch.argsort(margins).tolist()
    else:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
    budget = options["lam"] * options["beta"]
    target = PrivacyTarget(1.0, 1e-5)
    version, rows_out = 1, []
    for r in range(requests):
        removed, retained = session.split([order[r]], {}, [])
        inputs = replace(
            update_inputs(spec, dict(session.state), removed, retained, target=target),
            resident=resident,
        )
        started = time.perf_counter()
        try:
            release = head.unlearn(inputs)
        except TargetInfeasible:
            seconds = time.perf_counter() - started
            exact = convex.solve(head.problem(retained), 1e-10, 2000)
            state, resident = to_state(exact.theta), None
            rows_out.append({"released": False, "seconds": seconds})
        else:
            seconds = time.perf_counter() - started
            theta = to_theta(release.next_state)
            true = float(torch.linalg.norm(convex.gradient(head.problem(retained), theta)))
            state, resident = dict(release.next_state), release.resident
            m = release.metrics
            rows_out.append(
                {
                    "released": True,
                    "seconds": seconds,
                    "gradient_passes": m["gradient_passes"],
                    "hessian_passes": m["hessian_passes"],
                    "newton_steps": m["newton_steps"],
                    "true_gradient_over_budget": true / budget,
                }
            )
        version += 1
        session = session.advance(version, [order[r]], state, resident)
    released = [row for row in rows_out if row["released"]]
    pass_free = [r for r in released if r["gradient_passes"] == 0 and r["hessian_passes"] == 0]
    return {
        "case": name,
        "n": n,
        "features": p,
        "classes": k,
        "options": options,
        "requests": requests,
        "released": len(released),
        "released_pass_free": len(pass_free),
        "fallbacks": requests - len(released),
        "median_seconds": float(np.median([row["seconds"] for row in rows_out])),
        "median_gradient_passes": float(np.median([r["gradient_passes"] for r in released]))
        if released
        else None,
        "max_true_gradient_over_budget": max(
            (r["true_gradient_over_budget"] for r in released), default=None
        ),
        "per_request": rows_out,
    }


def far_start() -> list[dict[str, Any]]:
    """Goal 4's divergence, reproduced: 400 separable rows × 3 features, λ = 1e-4, R = 10, one
    row removed from a noise-free state 3, 10 and 30 times the trained optimum (where the loss
    is flat, so a full Newton step with the Hessian there overshoots); the bound on ‖∇F‖
    before and after the removal's steps (default options: 6 steps, 2 Hessian passes)."""

    from bench.common import model_spec
    from methods.compute import PrivacyTarget
    from methods.convex_head.compute import ConvexHead
    from tests.factories import separable_rows, split_off, update_inputs

    data = separable_rows()
    options = {"name": "convex_head", "lam": 1e-4, "R": 10.0, "beta": 1e-3}
    spec = model_spec({"type": "logreg", "feature_norm": 10.0}, {}, options, 3, 2)
    head = ConvexHead(spec)
    trained = head.train(data)
    rows = []
    for scale in (3.0, 10.0, 30.0):
        state = {k: v * scale for k, v in trained.state.items()}
        removed, retained = split_off(data, [5])
        inputs = update_inputs(spec, state, removed, retained, target=PrivacyTarget(1.0, 1e-5))
        after, work = head._removal(inputs)
        rows.append({"scale": scale, "bound_before": work.before, "bound_after": after.bound,
                     "gradient_passes": work.gradient_passes,
                     "hessian_passes": work.hessian_passes})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", help="a second source tree to run the same cases in")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--cases", nargs="+", default=list(CASES))
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="convex_branch")
    args = parser.parse_args()
    if args.one:  # inside one tree: print the cases' results as JSON
        cases = [run_case(c, args.requests) for c in args.cases]
        print(json.dumps({"cases": cases, "far_start": far_start()}))
        return
    from bench.common import run_in_tree, write_result

    here = Path(__file__).resolve().parent.parent
    trees = {"this": here, **({"other": Path(args.other).resolve()} if args.other else {})}
    result: dict[str, Any] = {"requests": args.requests, "trees": {}}
    for label, tree in trees.items():
        args_one = ["--requests", str(args.requests), "--cases", *args.cases]
        commit, found = run_in_tree(tree, "bench.convex_branch", args_one)
        cases = found["cases"]
        dirty = bool(subprocess.run(["git", "-C", str(tree), "status", "--porcelain"],
                                    capture_output=True, text=True).stdout.strip())  # fmt: skip
        result["trees"][label] = {"path": str(tree), "commit": commit, "dirty": dirty,
                                  "cases": cases, "far_start": found["far_start"]}  # fmt: skip
        print(label, "far start", [(r["scale"], r["bound_before"], r["bound_after"])
                                   for r in found["far_start"]])  # fmt: skip
        shown = ("released", "released_pass_free", "fallbacks", "median_gradient_passes",
                 "max_true_gradient_over_budget")  # fmt: skip
        for c in cases:
            print(label, c["case"], {k: c[k] for k in shown})
    print(write_result(args.out, result))


if __name__ == "__main__":
    main()
