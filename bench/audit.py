"""Privacy audits of every method with canaries (issue 31), side by side in one run.

For each method on a dataset where it applies (digits and the synthetic features data; the MLP,
the logistic head, random features for minnorm): the certified ε and the ε' it implies per
canary, the audited one-run and f-DP lower bounds with m canaries, the control's bounds (the
shadow before the removal: canaries never unlearned), the attack's AUC, the verdict, the audit's
wall time and, timed in the same run, one training of the model on its own rows.

    .venv/bin/python -m bench.audit [--canaries 1000] [--score margin]

Writes bench/results/audit.json and audit.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from app.schemas import BuiltinDatasetIn
from app.services.dataset_files import load_builtin
from app.specs import PrivacyPolicy
from bench.common import model_spec, write_result
from methods.compute import RetainedData, fit
from workers.privacy_audit import AuditOptions, run

MLP = {"type": "mlp", "hidden": [128]}
TRAINING = {"epochs": 100, "momentum": 0.9, "learning_rate": 0.1, "seed": 0}
# recollection and newton record the curvature of every step: 100 epochs take minutes
RECORDED = {"epochs": 10, "momentum": 0.9, "learning_rate": 0.1, "seed": 0}
CONFIGS: list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]] = [
    ("retrain", MLP, TRAINING, {"name": "retrain"}),
    ("sharded_retrain", MLP, TRAINING, {"name": "sharded_retrain", "shards": 4, "slices": 2}),
    ("minnorm", {"type": "random_features", "width": 4096}, TRAINING, {"name": "minnorm"}),
    ("minnorm_og", MLP, TRAINING, {"name": "minnorm_og", "epochs": 3, "descent_only_epochs": 1}),
    ("output_perturbation", MLP, TRAINING, {"name": "output_perturbation", "C0": 5.0}),
    ("noisy_finetune", MLP, TRAINING, {"name": "noisy_finetune", "T": 5, "batch_size": 16}),
    ("recollection", MLP, RECORDED, {"name": "recollection"}),
    ("newton", MLP, RECORDED, {"name": "newton"}),
    (
        "convex_head",
        {"type": "logreg", "feature_norm": 20.0},
        {},
        {"name": "convex_head", "lam": 1e-3, "R": 20.0, "beta": 1e-3},
    ),
    ("retrain (logreg)", {"type": "logreg"}, TRAINING, {"name": "retrain"}),
]
DATASETS = {
    "digits": BuiltinDatasetIn(builtin="digits"),
    "synthetic": BuiltinDatasetIn(builtin="synthetic", n_samples=3000, n_features=64, n_classes=10),
}


def split(name: str) -> tuple[RetainedData, RetainedData, int, int]:
    parsed = load_builtin(DATASETS[name])
    X, y = torch.from_numpy(parsed.X), torch.from_numpy(parsed.y)
    train = [i for i, s in enumerate(parsed.split) if s == "train"]
    test = [i for i, s in enumerate(parsed.split) if s == "test"]
    ids = torch.arange(1, len(y) + 1)
    return (
        RetainedData(ids[train].tolist(), X[train], y[train]),
        RetainedData(ids[test].tolist(), X[test], y[test]),
        int(torch.tensor(X.shape[1:]).prod()),
        parsed.n_classes,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--score", default="margin", choices=("loss", "margin"))
    parser.add_argument("--only", default=None, help="comma-separated method labels")
    parser.add_argument("--plot-only", action="store_true", help="redraw from the JSON")
    parser.add_argument(
        "--false-alarms",
        type=int,
        default=0,
        help="instead: audit an exact retrain this many times (fresh canaries and bits) and "
        "count the runs whose lower bound is above 0 (at most 1 − confidence of them)",
    )
    args = parser.parse_args()
    if args.false_alarms:
        false_alarms(args.false_alarms, AuditOptions(canaries=args.canaries, score=args.score))
        return
    if args.plot_only:
        plot(json.loads(Path("bench/results/audit.json").read_text())["rows"])
        return
    torch.set_num_threads(2)
    rows = []
    policy = PrivacyPolicy(allow_heuristic=True)
    options = AuditOptions(canaries=args.canaries, score=args.score)
    for dataset in DATASETS:
        retained, test, n_features, n_classes = split(dataset)
        for label, arch, training, method in CONFIGS:
            if args.only and label not in args.only.split(","):
                continue
            spec = model_spec(arch, training, method, n_features, n_classes)
            t0 = time.perf_counter()
            fit(spec, retained)
            train_s = time.perf_counter() - t0
            found = run(spec, policy, retained, test, options, seed=len(rows))
            doc = found.document()
            row = {
                "dataset": dataset,
                "label": label,
                "architecture": arch,
                "method": method,
                "n_train": len(retained),
                "one_training_s": train_s,
                "audit_s": doc["seconds"]["total"],  # type: ignore[index]
                "audit_over_training": doc["seconds"]["total"] / train_s,  # type: ignore[index,operator]
                **doc,
            }
            rows.append(row)
            print(
                f"{dataset:9s} {label:20s} {doc['guarantee']:11s} ε'={doc['implied_epsilon']} "
                f"lb={found.bounds.one_run.epsilon:.3f} fdp={found.bounds.fdp.epsilon:.3f} "
                f"control={found.control.one_run.epsilon if found.control else None:.3f} "
                f"auc={found.bounds.auc:.3f} {found.verdict} "
                f"{row['audit_s']:.1f}s vs train {train_s:.1f}s",
                flush=True,
            )
    result = {
        "canaries": args.canaries,
        "score": args.score,
        "confidence": options.confidence,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    write_result("audit", result)
    plot(rows)


def false_alarms(runs: int, options: AuditOptions) -> None:
    """An exact retrain's release does not depend on the bits: each audit wrongly finds ε > 0
    with probability at most 1 − confidence."""
    retained, test, n_features, n_classes = split("synthetic")
    spec = model_spec({"type": "logreg"}, TRAINING, {"name": "retrain"}, n_features, n_classes)
    bounds = []
    for seed in range(runs):
        found = run(spec, PrivacyPolicy(), retained, test, options, seed=1000 + seed)
        bounds.append(found.bounds.one_run.epsilon)
        print(seed, found.bounds.one_run.epsilon, found.verdict, flush=True)
    above = sum(b > 0 for b in bounds)
    write_result(
        "audit_false_alarms",
        {
            "method": "retrain (logreg)",
            "dataset": "synthetic",
            "canaries": options.canaries,
            "confidence": options.confidence,
            "runs": runs,
            "runs_with_a_bound_above_0": above,
            "rate": above / runs,
            "bounds": bounds,
        },
    )


def plot(rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    for ax, dataset in zip(axes, DATASETS, strict=True):
        mine = [r for r in rows if r["dataset"] == dataset]
        x = range(len(mine))
        ax.bar(
            [i - 0.3 for i in x], [r["one_run"]["epsilon"] for r in mine], 0.2, label="ε_lb one-run"
        )
        ax.bar([i - 0.1 for i in x], [r["fdp"]["epsilon"] for r in mine], 0.2, label="ε_lb f-DP")
        ax.bar(
            [i + 0.1 for i in x],
            [r["control"]["one_run"]["epsilon"] if r["control"] else 0 for r in mine],
            0.2,
            label="control ε_lb one-run",
        )
        implied = [
            r["implied_epsilon"] if r["implied_epsilon"] is not None else float("nan") for r in mine
        ]
        ax.scatter([i + 0.3 for i in x], implied, marker="_", s=300, color="k", label="ε' implied")
        ax.scatter(
            [i - 0.2 for i in x],
            [r["ceiling_one_run"] for r in mine],
            marker="v",
            color="grey",
            label="one-run ceiling (perfect attack)",
        )
        ax.set_xticks(list(x), [r["label"] for r in mine], rotation=40, ha="right")
        ax.set_title(f"{dataset}: {len(mine)} audits, one run each; verdicts in the JSON")
        ax.set_ylabel("ε per canary")
        ax.set_ylim(0, max(6.0, mine[0]["ceiling_fdp"] + 0.5))
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig("bench/results/audit.png", dpi=110)


if __name__ == "__main__":
    main()
