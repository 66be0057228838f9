"""SISA (`sharded_retrain`): accuracy against the cost of a deletion.

Part 1, the compute halves (no service), on the digits MLP 64-64 (the split and training of
bench/noisy_finetune.py) and on a synthetic 100,000-sample task (the `synthetic` builtin,
40 features, 10 classes): for S ∈ {1, 4, 16} × R ∈ {1, 4}, training time, test accuracy
(averaged probabilities and majority vote), storage, and the compute of single-sample
deletions (sequential, each on the previous update's state), against the single model
trained by `retrain` and its full retrain.

Part 2, through the embedded service (a real `lethe serve`): POST→certificate of single-sample
deletions on a sharded digits model and on the same model with `retrain`, and the throughput
of 200 single-sample deletions posted at once, which the pipeline coalesces.

    .venv/bin/python -m bench.sharded [--deletions 5] [--skip-service]

Writes bench/results/sharded.json and sharded.png (accuracy against deletion cost, with the
certified methods at a true ε = 1 from bench/results/noisy_finetune.json).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save as st_save
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from bench.common import RESULTS, model_spec, percentiles, ready, update_inputs, write_result

ARCH = {"type": "mlp", "hidden": [64, 64], "activation": "relu"}
TASKS: dict[str, dict[str, Any]] = {
    "digits": {
        "training": {
            "epochs": 20,
            "batch_size": 64,
            "learning_rate": 0.1,
            "weight_decay": 1e-4,
            "seed": 0,
        },
    },
    "synthetic_100k": {
        "training": {
            "epochs": 10,
            "batch_size": 128,
            "learning_rate": 0.1,
            "weight_decay": 1e-4,
            "seed": 0,
        },
    },
}
SETTINGS = [(1, 1), (1, 4), (4, 1), (4, 4), (16, 1), (16, 4)]
COLOURS = {1: "tab:blue", 4: "tab:green", 16: "tab:purple"}
SERVICE = {  # dataset, sharded setting; each also served with `retrain` for comparison
    "digits": ({"builtin": "digits"}, 4, 4),
    "synthetic_100k": (
        {"builtin": "synthetic", "n_samples": 125_000, "n_features": 40, "n_classes": 10},
        16,
        4,
    ),
}


def digits() -> tuple[torch.Tensor, ...]:
    """bench/noisy_finetune.py's split: 80/20, stratified, random_state 0."""
    data = load_digits()
    X = torch.tensor(data.images / 16.0, dtype=torch.float32).reshape(len(data.target), -1)
    y = torch.tensor(data.target)
    train, test = train_test_split(
        np.arange(len(y)), test_size=0.2, random_state=0, stratify=data.target
    )
    return X[train], y[train], X[test], y[test]


def synthetic() -> tuple[torch.Tensor, ...]:
    """The service's `synthetic` builtin at 125,000 samples: 100,000 train, 25,000 test."""
    from app.core.formats.dataset_files import load_builtin
    from app.core.schemas import BuiltinDatasetIn

    spec = BuiltinDatasetIn.model_validate(
        {"builtin": "synthetic", "n_samples": 125_000, "n_features": 40, "n_classes": 10}
    )
    parsed = load_builtin(spec)
    X, y = torch.tensor(parsed.X), torch.tensor(parsed.y)
    train = torch.tensor([s == "train" for s in parsed.split])
    return X[train], y[train], X[~train], y[~train]


def accuracy(spec: Any, state: dict, X: torch.Tensor, y: torch.Tensor, how: str) -> float:
    from maths.training import accuracy as acc

    value = acc(spec.architecture, state, X, y, spec.n_classes, how)
    assert value is not None
    return value


def measure_task(name: str, deletions: int) -> dict[str, Any]:
    """Training, accuracy, storage and single-sample deletion compute, per (S, R)."""
    from methods.compute import PrivacyTarget, RemovedSamples, RetainedData, fit, method_for

    Xtr, ytr, Xte, yte = digits() if name == "digits" else synthetic()
    training = TASKS[name]["training"]
    n, d, k = len(ytr), Xtr.shape[1], int(ytr.max()) + 1
    ids = list(range(n))
    data = RetainedData(ids, Xtr, ytr, [None] * n)
    rng = np.random.default_rng(1)
    victims = [int(i) for i in rng.choice(n, size=deletions, replace=False)]

    plain = model_spec(ARCH, training, {"name": "retrain"}, d, k)
    warm = 512  # a short warm-up run: the first training in a process pays torch's start-up
    fit(plain, RetainedData(ids[:warm], Xtr[:warm], ytr[:warm], [None] * warm))
    start = time.perf_counter()
    single = fit(plain, data)
    single_seconds = time.perf_counter() - start
    out: dict[str, Any] = {
        "n_train": n,
        "n_test": len(yte),
        "training": training,
        "single_model": {
            "train_seconds": single_seconds,
            "test_accuracy": accuracy(plain, single.state, Xte, yte, "probabilities"),
            "weights_bytes": len(st_save(single.state)),
        },
        "settings": [],
    }
    print(f"{name}: single model {out['single_model']}")
    for shards, slices in SETTINGS:
        method = {"name": "sharded_retrain", "shards": shards, "slices": slices}
        spec = model_spec(ARCH, training, method, d, k)
        start = time.perf_counter()
        trained = fit(spec, data)
        train_seconds = time.perf_counter() - start
        state, kept = trained.next_state, list(ids)
        seconds, fractions = [], []
        for victim in victims:
            kept.remove(victim)
            rows = torch.tensor(kept)
            removed = RemovedSamples([victim], Xtr[[victim]], ytr[[victim]])
            retained = RetainedData(list(kept), Xtr[rows], ytr[rows], [None] * len(kept))
            inputs = update_inputs(spec, state, removed, retained, PrivacyTarget(1.0, 1e-5))
            start = time.perf_counter()
            release = method_for("sharded_retrain", spec).unlearn(inputs)
            seconds.append(time.perf_counter() - start)
            fractions.append(release.certificate.details["sharding"]["work_fraction"])
            state = release.next_state
        row = {
            "shards": shards,
            "slices": slices,
            "train_seconds": train_seconds,
            "test_accuracy": accuracy(spec, trained.state, Xte, yte, "probabilities"),
            "test_accuracy_vote": accuracy(spec, trained.state, Xte, yte, "vote"),
            "weights_bytes": len(st_save(trained.state)),
            "state_bytes": len(st_save(trained.next_state)),
            "checkpoints": trained.metrics["sisa"]["checkpoints"],
            "expected_work_fraction": trained.metrics["sisa"]["expected_work_fraction"],
            "deletion_seconds": percentiles(seconds),
            "deletion_work_fraction": percentiles(fractions),
            "speedup_vs_single_retrain": single_seconds / float(np.median(seconds)),
        }
        print(f"{name} S={shards} R={slices}: {json.dumps(row)[:300]}")
        out["settings"].append(row)
    return out


# ---- through the service ---------------------------------------------------------------


def service(deletions: int, burst: int) -> dict[str, Any]:
    """POST→certificate of single-sample deletions, sharded against `retrain`, per task; the
    coalesced burst on the sharded digits model."""
    from app.client import Client
    from tests.support.cluster import Cluster

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), None, None) as cluster:
        c = Client(cluster.start_api(), cluster.admin_key, timeout=1800)
        warm_ds = c.post("/v1/datasets", json={"builtin": "digits"})
        warm = c.post(  # the worker's first training pays torch's start-up: not a measurement
            "/v1/models",
            json={"name": "warm-up", "dataset_id": warm_ds["id"], "architecture": ARCH},
        )
        c.wait_model(warm["id"])
        for task, (dataset, shards, slices) in SERVICE.items():
            methods = {
                f"sharded_retrain S={shards} R={slices}": {
                    "name": "sharded_retrain",
                    "shards": shards,
                    "slices": slices,
                },
                "retrain": {"name": "retrain"},
            }
            out[task] = {}
            for label, method in methods.items():
                ds = ready(c, c.post("/v1/datasets", json=dataset))
                row = _serve(c, ds["id"], TASKS[task]["training"], label, method, deletions)
                if method["name"] == "sharded_retrain" and task == "digits":
                    row["burst"] = _burst(c, ds["id"], row.pop("model_id"), burst)
                row.pop("model_id", None)
                print(task, label, row)
                out[task][label] = row
    return out


def _serve(
    c: Any, dataset_id: int, training: dict, label: str, method: dict, deletions: int
) -> dict[str, Any]:
    start = time.time()
    model = c.post(
        "/v1/models",
        json={
            "name": label,
            "dataset_id": dataset_id,
            "architecture": ARCH,
            "training": training,
            "method": method,
        },
    )
    model = c.wait_model(model["id"]).model_dump(mode="json")
    post_to_ready = time.time() - start
    ids = _train_ids(c, dataset_id, deletions)
    latencies, compute = [], []
    for external in ids:
        start = time.time()
        request = c.post("/v1/deletions", json={"dataset_id": dataset_id, "sample_ids": [external]})
        assert c.wait_deletion(request["id"]).status == "done"
        latencies.append(time.time() - start)
        version = c.get(f"/v1/models/{model['id']}")["current_version"]
        compute.append(version["metrics"]["unlearn_seconds"])
    return {
        "model_id": model["id"],
        "post_to_ready_seconds": post_to_ready,
        "post_to_certificate_seconds": percentiles(latencies),
        "update_compute_seconds": percentiles(compute),
        "storage": version["metrics"]["storage"],
        "preview_deletion_cost": c.get("/v1/privacy/preview", params={"model": model["id"]})[
            "deletion_cost"
        ],
    }


def _train_ids(c: Any, dataset_id: int, n: int, offset: int = 0) -> list[str]:
    page = c.get(
        f"/v1/datasets/{dataset_id}/samples",
        params={"split": "train", "limit": n, "offset": offset},
    )
    return [s["external_id"] for s in page["items"]]


def _burst(c: Any, dataset_id: int, model_id: int, n: int) -> dict[str, Any]:
    """n single-sample requests posted at once from 8 threads; time until the last is done."""
    ids = _train_ids(c, dataset_id, n, offset=100)
    before = c.get(f"/v1/models/{model_id}")["current_version"]["number"]
    start = time.time()
    with ThreadPoolExecutor(8) as pool:
        requests = list(
            pool.map(
                lambda e: c.post(
                    "/v1/deletions", json={"dataset_id": dataset_id, "sample_ids": [e]}
                ),
                ids[:n],
            )
        )
    posted = time.time() - start
    for r in requests:
        assert c.wait_deletion(r["id"]).status == "done"
    seconds = time.time() - start
    after = c.get(f"/v1/models/{model_id}")["current_version"]
    return {
        "requests": n,
        "post_seconds": posted,
        "seconds_to_last_certificate": seconds,
        "deletions_per_second": n / seconds,
        "updates": after["number"] - before,
        "requests_per_update": n / max(1, after["number"] - before),
    }


# ---- the plot ----------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    for ax, (name, task) in zip(axes, result["tasks"].items(), strict=True):
        single = task["single_model"]
        for row in task["settings"]:
            ax.scatter(
                row["deletion_work_fraction"]["p50"],
                row["test_accuracy"],
                color=COLOURS[row["shards"]],
                marker="o" if row["slices"] == 1 else "^",
                s=40,
                label=f"SISA S={row['shards']} R={row['slices']}",
            )
        label = "full retrain (single model)"
        if name == "digits":
            label += "; recollection and newton at ε = 1 fall back to it (vacuous bounds)"
        ax.scatter(1.0, single["test_accuracy"], color="black", marker="s", label=label)
        if name == "digits":
            _certified(ax)
        ax.set_xscale("log")
        ax.set_xlabel("work of one single-sample deletion (fraction of a full retrain)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{name}, MLP 64-64, n = {task['n_train']:,}")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _certified(ax: Any) -> None:
    """The certified methods at a true ε = 1 on the same digits MLP (bench/noisy_finetune)."""
    source = RESULTS / "noisy_finetune.json"
    if not source.exists():
        return
    nf = json.loads(source.read_text())
    epochs = nf["budget_epochs"]
    full = max(epochs)
    for series, colour in (("gradient_clipping", "tab:red"), ("model_clipping", "tab:orange")):
        points = [
            (e / full, a) for e, a in zip(epochs, nf["series"][series], strict=True) if e and a
        ]
        ax.plot(*zip(*points, strict=True), color=colour, lw=1, label=f"noisy_finetune {series}")
    op = nf["series"]["output_perturbation"][-1]
    ax.scatter(1e-3, op, color="tab:purple", marker="x", label="output_perturbation (≈ no work)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--deletions", type=int, default=5)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--skip-service", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    result: dict[str, Any] = {
        "architecture": ARCH,
        "tasks": {name: measure_task(name, args.deletions) for name in TASKS},
    }
    if not args.skip_service:
        result["service"] = service(args.deletions, args.burst)
    path = write_result("sharded", result)
    plot(result, RESULTS / "sharded.png")
    print(f"wrote {path} and {RESULTS / 'sharded.png'}")


if __name__ == "__main__":
    main()
