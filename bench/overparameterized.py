"""Seed 001: the exact min-norm projection against a from-scratch solve, and
MinNorm-OG against retraining and doing nothing.

Exact path: synthetic data (make_classification, the service's builtin), n = 5,000 training
rows, p = 20,000 (19,999 ReLU random features + bias), float64, on the CPU. Training is the
from-scratch min-norm solve; each removal of m = 1, 10, 100 rows runs `minnorm`'s update (the
Gram-inverse downdate and refined projection) from the trained state, then the from-scratch
solve on the same retained rows, and compares the two θ. Storage: the safetensors bytes of
the released weights and of the noise-free state (which holds the n × n Gram inverse).

MinNorm-OG: digits, MLP [64, 64] trained by the service's SGD (20 epochs), 5% of the training
rows forgotten; accuracies and membership-inference AUC of the release, of the original model
(doing nothing) and of the seeded retrain, and the time of each.

    .venv/bin/python -m bench.overparameterized [--n 5000] [--width 19999]

Writes bench/results/overparameterized.json and overparameterized.png.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
from safetensors.torch import save as st_save

from app.core.formats.dataset_files import load_builtin
from app.core.schemas import BuiltinDatasetIn
from bench.common import RESULTS, model_spec, update_inputs, write_result
from maths.training import accuracy, train
from methods.compute import PrivacyTarget, RemovedSamples, RetainedData
from methods.minnorm.compute import MinNorm
from workers.updates import compute

TARGET = PrivacyTarget(1.0, 1e-5)


def split(builtin: dict[str, Any]) -> tuple[RetainedData, RetainedData, int]:
    data = load_builtin(BuiltinDatasetIn.model_validate(builtin))
    X, y = torch.from_numpy(data.X), torch.from_numpy(data.y)
    is_train = torch.tensor([s == "train" for s in data.split])
    ids = torch.arange(len(y))
    train_ids, test_ids = ids[is_train].tolist(), ids[~is_train].tolist()
    return (
        RetainedData(train_ids, X[is_train], y[is_train]),
        RetainedData(test_ids, X[~is_train], y[~is_train]),
        data.n_classes,
    )


def rows(data: RetainedData, index: torch.Tensor) -> RetainedData:
    return RetainedData([data.sample_ids[i] for i in index.tolist()], data.X[index], data.y[index])


def exact_path(n: int, width: int, d: int) -> dict[str, Any]:
    n_samples = int(n / 0.8) + 2
    trainset, _, k = split(
        {"builtin": "synthetic", "n_samples": n_samples, "n_features": d, "n_classes": 2}
    )
    trainset = rows(trainset, torch.arange(n))
    arch = {"type": "random_features", "width": width, "activation": "relu", "seed": 0}
    spec = model_spec(arch, {}, {"name": "minnorm"}, d, k)
    method = MinNorm(spec)
    start = time.perf_counter()
    trained = method.train(trainset)
    train_seconds = time.perf_counter() - start
    print(f"trained n={n} p={width + 1}: {train_seconds:.1f} s", flush=True)
    storage = {
        "weights_bytes": len(st_save(trained.state)),
        "noise_free_state_bytes": len(st_save(trained.next_state)),
        "gram_inverse_bytes": trained.metrics["gram_inverse_bytes"],
    }
    removals = []
    for m in (1, 10, 100):
        gone = torch.arange(m)
        kept = torch.arange(m, n)
        inputs = update_inputs(
            spec,
            trained.next_state,
            RemovedSamples(list(range(m)), trainset.X[gone], trainset.y[gone]),
            rows(trainset, kept),
            TARGET,
        )
        start = time.perf_counter()
        release = method.unlearn(inputs)
        unlearn_seconds = time.perf_counter() - start
        start = time.perf_counter()
        fresh = method.train(inputs.retained)
        fresh_seconds = time.perf_counter() - start
        a = torch.cat([release.weights["2.weight"], release.weights["2.bias"][:, None]], 1)
        b = torch.cat([fresh.state["2.weight"], fresh.state["2.bias"][:, None]], 1)
        row = {
            "removed": m,
            "update_seconds": unlearn_seconds,
            "fresh_solve_seconds": fresh_seconds,
            "speedup": fresh_seconds / unlearn_seconds,
            "relative_difference": float((a - b).norm() / b.norm()),
            "route": release.metrics["route"],
            "interpolation_residual": release.metrics["interpolation_residual"],
        }
        print(row, flush=True)
        removals.append(row)
    return {
        "n": n,
        "p": width + 1,
        "input_features": d,
        "train_seconds": train_seconds,
        "storage": storage,
        "removals": removals,
    }


def minnorm_og(fraction: float, configs: list[dict[str, Any]]) -> dict[str, Any]:
    trainset, test, k = split({"builtin": "digits"})
    d = int(np.prod(trainset.X.shape[1:]))
    arch = {"type": "mlp", "hidden": [64, 64]}
    training = {"epochs": 20, "batch_size": 64, "learning_rate": 0.1, "seed": 0}
    start = time.perf_counter()
    state = train(arch, training, trainset.X, trainset.y, k)
    original_seconds = time.perf_counter() - start
    gen = torch.Generator().manual_seed(0)
    order = torch.randperm(len(trainset.y), generator=gen)
    m = int(round(fraction * len(order)))
    gone, kept = order[:m].sort().values, order[m:].sort().values
    removed = RemovedSamples(
        [trainset.sample_ids[i] for i in gone.tolist()], trainset.X[gone], trainset.y[gone]
    )
    retained = rows(trainset, kept)

    def acc(s: dict[str, torch.Tensor], data: RetainedData | RemovedSamples) -> float | None:
        return accuracy(arch, s, data.X, data.y, k)

    results = []
    for options in configs:
        method = {"name": "minnorm_og", "evaluate": True, **options}
        spec = model_spec(arch, training, method, d, k)
        inputs = update_inputs(spec, state, removed, retained, TARGET, test=test)
        inputs = inputs.__class__(
            **{
                **inputs.__dict__,
                "policy": inputs.policy.model_copy(update={"allow_heuristic": True}),
            }
        )
        outcome = compute(inputs)
        ev = outcome.metrics["evaluation"]
        assert outcome.decision.method == "minnorm_og"
        results.append(
            {
                "options": options,
                "seconds": outcome.decision.release.metrics["unlearn_seconds"],
                "test_accuracy": ev["test_accuracy"],
                "forget_accuracy": ev["forget_accuracy"],
                "retain_accuracy": ev["retain_accuracy"],
                "mia_auc": ev["mia_auc"],
                "distance_to_retrain": ev["reference"]["distance_release"],
                "retrain": ev["reference"],
                "original": ev["original"],
            }
        )
        print(
            options,
            {
                k2: results[-1][k2]
                for k2 in ("seconds", "test_accuracy", "forget_accuracy", "mia_auc")
            },
            flush=True,
        )
    start = time.perf_counter()
    retrained = train(arch, training, retained.X, retained.y, k)
    retrain_seconds = time.perf_counter() - start
    return {
        "dataset": "digits",
        "architecture": arch,
        "training": training,
        "forgotten": m,
        "n_train": len(order),
        "do_nothing": {
            "test_accuracy": acc(state, test),
            "forget_accuracy": acc(state, removed),
            "retain_accuracy": acc(state, retained),
            "mia_auc": results[0]["original"]["mia_auc"],
            "train_seconds": original_seconds,
        },
        "retrain": {
            "test_accuracy": acc(retrained, test),
            "forget_accuracy": acc(retrained, removed),
            "retain_accuracy": acc(retrained, retained),
            "mia_auc": results[0]["retrain"]["mia_auc"],
            "seconds": retrain_seconds,
        },
        "minnorm_og": results,
    }


def plot(result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    exact = result["exact"]
    ms = [r["removed"] for r in exact["removals"]]
    x = np.arange(len(ms))
    left.bar(x - 0.2, [r["update_seconds"] for r in exact["removals"]], 0.4, label="minnorm update")
    left.bar(
        x + 0.2,
        [r["fresh_solve_seconds"] for r in exact["removals"]],
        0.4,
        label="fresh min-norm solve",
    )
    left.set_xticks(x, [f"m = {m}" for m in ms])
    left.set_ylabel("seconds (CPU, 2 cores)")
    left.set_title(f"exact path, n = {exact['n']:,}, p = {exact['p']:,}")
    left.legend()
    og = result["minnorm_og"]
    names = ["do nothing", "retrain"] + [
        f"MinNorm-OG {i + 1}" for i in range(len(og["minnorm_og"]))
    ]
    rows_ = [og["do_nothing"], og["retrain"], *og["minnorm_og"]]
    metrics = ["test_accuracy", "forget_accuracy", "retain_accuracy", "mia_auc"]
    width = 0.8 / len(rows_)
    for i, (name, row) in enumerate(zip(names, rows_, strict=True)):
        right.bar(np.arange(4) + i * width, [row[k] or 0 for k in metrics], width, label=name)
    right.set_xticks(
        np.arange(4) + 0.4 - width / 2, ["test acc", "forget acc", "retain acc", "MIA AUC"]
    )
    right.set_ylim(0.4, 1.02)
    right.set_title(f"digits MLP, {og['forgotten']} of {og['n_train']} forgotten")
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "overparameterized.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--width", type=int, default=19_999)
    parser.add_argument("--features", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(2)
    result = {
        "exact": exact_path(args.n, args.width, args.features),
        "minnorm_og": minnorm_og(
            0.05,
            [
                {},  # the defaults
                {"epochs": 20, "kappa": 0.2, "descent_only_epochs": 5},
            ],
        ),
    }
    path = write_result("overparameterized", result)
    plot(result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
