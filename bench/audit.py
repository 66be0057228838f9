"""Privacy audits of every method with canaries, side by side in one run.

For each method on a dataset where it applies (digits and the synthetic features data; the MLP,
the logistic head, random features for minnorm): the certified ε and the ε' it implies per
canary, the audited one-run and f-DP lower bounds with m canaries, the control's bounds (the
shadow before the removal: canaries never unlearned), the attack's AUC, the verdict, the audit's
wall time and, timed in the same run, one training of the model on its own rows.

    .venv/bin/python -m bench.audit [--canaries 1000] [--score margin]

Writes bench/results/audit.json and audit.png. Issue 56: every row carries the joint test of
the certificate's own ε (`joint`: the bound, the statistic, its ceiling) beside the certified
ε, which is what the verdict now compares.

    .venv/bin/python -m bench.audit --false-alarms 20     # exact retrains, fresh seeds
    .venv/bin/python -m bench.audit --false-alarms 20 --score weights   # ..._weights.json
    .venv/bin/python -m bench.audit --overclaims          # issue 56's false certificates
    .venv/bin/python -m bench.audit --joint-shift 12      # the joint shift's power and alarms

`--overclaims` audits newton with constants declared false on purpose (L = M = 0, a large
λ_min, C = 1000, depth 1, H_sc = 1e9: essentially no unlearning, tiny certified noise) on a
1,000 × 1,000 five-class Gaussian set (logreg) and on digits (the README's MLP 64², 20
epochs), at ε = 1 and 5: the joint bound against the certified ε, and the per-canary verdict
it replaces. Writes bench/results/audit_overclaims.json.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from app.core.formats.dataset_files import load_builtin
from app.core.schemas import BuiltinDatasetIn
from app.core.specs import PrivacyPolicy
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
    parser.add_argument("--score", default="margin", choices=("loss", "margin", "weights"))
    parser.add_argument("--only", default=None, help="comma-separated method labels")
    parser.add_argument("--plot-only", action="store_true", help="redraw from the JSON")
    parser.add_argument(
        "--false-alarms",
        type=int,
        default=0,
        help="instead: audit an exact retrain this many times (fresh canaries and bits) and "
        "count the runs whose lower bound is above 0 (at most 1 − confidence of them)",
    )
    parser.add_argument("--overclaims", action="store_true", help="issue 56's false certificates")
    parser.add_argument(
        "--joint-shift",
        type=int,
        default=0,
        help="instead: audit newton's 20× overclaim (4 classes, 300 features, G_max 3) this "
        "many times and honest convex_head, retrain and sharded_retrain releases, each with "
        "and without the joint-shift statistic (audit_joint_shift.json)",
    )
    args = parser.parse_args()
    if args.joint_shift:
        joint_shift_runs(args.joint_shift, args.canaries)
        return
    if args.overclaims:
        overclaims(AuditOptions(canaries=args.canaries, score=args.score))
        return
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
            joint = found.bounds.joint
            print(
                f"{dataset:9s} {label:20s} {doc['guarantee']:11s} ε={doc['certified_epsilon']} "
                f"joint={joint.epsilon if joint else 0:.3f} (ceiling "
                f"{joint.ceiling if joint else 0:.0f}) ε'={doc['implied_epsilon']} "
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
    bounds, joint, verdicts = [], [], []
    for seed in range(runs):
        found = run(spec, PrivacyPolicy(), retained, test, options, seed=1000 + seed)
        bounds.append(found.bounds.one_run.epsilon)
        joint.append(found.bounds.joint.epsilon if found.bounds.joint else 0.0)
        verdicts.append(found.verdict)
        print(seed, joint[-1], found.bounds.one_run.epsilon, found.verdict, flush=True)
    write_result(
        "audit_false_alarms" + ("_weights" if options.score == "weights" else ""),
        {
            "method": "retrain (logreg)",
            "score": options.score,
            "dataset": "synthetic",
            "canaries": options.canaries,
            "confidence": options.confidence,
            "runs": runs,
            "violated": verdicts.count("violated"),
            "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
            "joint_bounds": joint,
            "runs_with_a_one_run_bound_above_0": sum(b > 0 for b in bounds),
            "one_run_bounds": bounds,
            "simulated_null_rate": simulated_null_rate(options.canaries, options.confidence),
        },
    )


def simulated_null_rate(m: int, confidence: float, runs: int = 1000) -> dict[str, Any]:
    """How often the joint bound is above 0 when the scores are independent of the bits (an
    exact release): at most 1 − confidence by construction, less where the K statistics
    agree. What `violated` in 0 of 20 exact audits can be expected from."""
    import numpy as np

    from app.privacy.audit_bounds import joint_bound

    rng = np.random.default_rng(56)
    above = sum(
        joint_bound(rng.standard_normal(m), rng.random(m) < 0.5, 0.0, confidence, rng,
                    permutations=2000).epsilon > 0
        for _ in range(runs)
    )  # fmt: skip
    rate = above / runs
    return {"runs": runs, "above_0": above, "rate": rate, "p_none_of_20": (1 - rate) ** 20}


# newton with its constants declared false on purpose: almost no unlearning step
# and almost no noise, certified (ε, δ) all the same
FALSE_NEWTON = {"name": "newton", "L": 0.0, "M": 0.0, "C": 1000.0, "depth": 1, "H_sc": 1e9}


def overclaims(options: AuditOptions) -> None:
    """The issue's table, audited again: each false certificate's joint bound and verdict."""
    import numpy as np

    rng = np.random.default_rng(0)
    n, p, k = 1000, 1000, 5
    y = rng.integers(0, k, n + 400)
    X = (rng.standard_normal((k, p)) * 0.15)[y] + rng.standard_normal((n + 400, p))
    gaussian = (
        RetainedData(list(range(1, n + 1)), torch.tensor(X[:n], dtype=torch.float32),
                     torch.tensor(y[:n])),
        RetainedData(list(range(n + 1, n + 401)), torch.tensor(X[n:], dtype=torch.float32),
                     torch.tensor(y[n:])),
    )  # fmt: skip
    datasets = {"gaussian": (*gaussian, p, k), "digits": split("digits")}
    cases: list[tuple[str, str, dict[str, Any], dict[str, Any], dict[str, Any], float]] = [
        ("Gaussian logreg, λ_min 1e6", "gaussian", {"type": "logreg"}, TRAINING,
         {**FALSE_NEWTON, "lam_min": 1e6}, 1.0),
        ("Gaussian logreg, λ_min 3e4, max_relative_noise 10", "gaussian", {"type": "logreg"},
         TRAINING, {**FALSE_NEWTON, "lam_min": 3e4, "max_relative_noise": 10.0}, 1.0),
        ("Gaussian logreg, λ_min 1e6, ε = 5", "gaussian", {"type": "logreg"}, TRAINING,
         {**FALSE_NEWTON, "lam_min": 1e6}, 5.0),
        ("digits MLP 64², 20 epochs", "digits", {"type": "mlp", "hidden": [64, 64]},
         {"epochs": 20, "momentum": 0.9, "learning_rate": 0.1, "seed": 0},
         {**FALSE_NEWTON, "lam_min": 1e6}, 1.0),
    ]  # fmt: skip
    rows = []
    for label, data, arch, training, method, epsilon in cases:
        for kind, score in COMBINATIONS:
            if kind == "leverage" and arch["type"] != "logreg":
                continue
            rows.append(
                overclaim(label, datasets[data], arch, training, method, epsilon, kind, score,
                          options, len(rows))
            )  # fmt: skip
    write_result("audit_overclaims", {"canaries": options.canaries, "rows": rows})


# every canary kind beside every score on the table's cases
COMBINATIONS = [("random", "loss"), ("random", "weights"), ("leverage", "loss"),
                ("leverage", "weights")]  # fmt: skip


def overclaim(
    label: str,
    data: tuple[RetainedData, RetainedData, int, int],
    arch: dict[str, Any],
    training: dict[str, Any],
    method: dict[str, Any],
    epsilon: float,
    kind: str,
    score: str,
    options: AuditOptions,
    seed: int,
) -> dict[str, Any]:
    """One false certificate audited with one canary kind and score."""
    retained, test, features, classes = data
    spec = model_spec(arch, training, method, features, classes)
    policy = PrivacyPolicy(epsilon=epsilon, lineage_epsilon=max(10.0, 2 * epsilon))
    chosen = replace(options, kind=kind, score=score)  # type: ignore[arg-type]
    found = run(spec, policy, retained, test, chosen, seed=seed)
    doc = found.document()
    joint = found.bounds.joint
    assert joint is not None
    one_run = found.bounds.one_run.epsilon
    print(f"{label:50s} {kind:8s} {score:7s} ε={doc['certified_epsilon']} "
          f"joint≥{joint.epsilon:.2f} ({joint.statistic}) auc={found.bounds.auc:.3f} "
          f"one-run={one_run:.2f} {found.verdict} [{doc['audited']}]", flush=True)  # fmt: skip
    return {"label": label, "kind": kind, "score": score, "method": method,
            "architecture": arch, **doc}  # fmt: skip


def gaussian_logreg(n: int, p: int, k: int, seed: int) -> tuple[RetainedData, RetainedData]:
    """n training and 400 test rows of k Gaussian classes in p dimensions (means 0.15 apart
    per coordinate), ids 1… in order."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n + 400)
    X = (rng.standard_normal((k, p)) * 0.15)[y] + rng.standard_normal((n + 400, p))

    def as_rows(a: int, b: int) -> RetainedData:
        ids = list(range(a + 1, b + 1))
        return RetainedData(ids, torch.tensor(X[a:b], dtype=torch.float32), torch.tensor(y[a:b]))

    return as_rows(0, n), as_rows(n, n + 400)


SHIFT_CASES: list[tuple[str, dict[str, Any], bool]] = [  # (label, method, certificate honest)
    ("newton, L = M = 0, λ_min 1e4, G_max 3 (a 20× overclaim)",
     {**FALSE_NEWTON, "lam_min": 1e4, "G_max": 3.0}, False),
    ("convex_head (λ 1e-3, R 20)", {"name": "convex_head", "lam": 1e-3, "R": 20.0}, True),
    ("retrain", {"name": "retrain"}, True),
    ("sharded_retrain (S 4, R 2)", {"name": "sharded_retrain", "shards": 4, "slices": 2}, True),
]  # fmt: skip
SHIFT_ATTACKS = [("random", "loss"), ("random", "margin"), ("random", "weights"),
                 ("leverage", "weights")]  # fmt: skip


def joint_shift_runs(runs: int, canaries: int) -> None:
    """Each case audited `runs` times (the attacks in turn, fresh seeds), once with the joint
    shift and once without (the statistic switched off, the rest alike): verdicts, the
    statistic that proved each bound, and the joint shift's z."""
    import workers.privacy_audit as audit

    retained, test = gaussian_logreg(1000, 300, 4, seed=0)
    policy = PrivacyPolicy(epsilon=1.0, max_relative_noise=None)
    with_shift = audit._shift
    seen: list[float | None] = []

    def recorded(*args: Any, **kwargs: Any) -> float | None:
        z = with_shift(*args, **kwargs)
        seen.append(z)
        return z

    rows = []
    for label, method, honest in SHIFT_CASES:
        spec = model_spec({"type": "logreg"}, TRAINING, method, 300, 4)
        for shift_on in (True, False):
            off = lambda *a, **k: None  # noqa: E731
            audit._shift = recorded if shift_on else off  # type: ignore[assignment]
            verdicts, statistics, zs = [], [], []
            for seed in range(runs):
                kind, score = SHIFT_ATTACKS[seed % len(SHIFT_ATTACKS)]
                if honest and method["name"] == "sharded_retrain" and score == "weights":
                    kind, score = "random", "loss"  # an ensemble has no weights score
                seen.clear()
                options = AuditOptions(canaries, kind, score)  # type: ignore[arg-type]
                found = run(spec, policy, retained, test, options, seed=seed)
                joint = found.bounds.joint
                verdicts.append(found.verdict)
                statistics.append(joint.statistic if joint else "none")
                zs.append(seen[0] if seen else None)
                bound = joint.epsilon if joint else 0.0
                print(f"{label[:40]:40s} shift={shift_on} {kind}/{score} {found.verdict} "
                      f"{bound:.2f} {statistics[-1]}", flush=True)  # fmt: skip
            rows.append({
                "case": label, "honest": honest, "joint_shift": shift_on, "runs": runs,
                "violated": verdicts.count("violated"),
                "verdicts": {v: verdicts.count(v) for v in sorted(set(verdicts))},
                "proved_by": statistics, "z": zs,
            })  # fmt: skip
    audit._shift = with_shift  # type: ignore[assignment]
    write_result("audit_joint_shift", {"canaries": canaries, "attacks": SHIFT_ATTACKS,
                                       "rows": rows})  # fmt: skip


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
