"""Worker compute per device: for each method, the time of training and of
one single-sample deletion's compute, on CPU or on a GPU, with no database, Redis or service.

Both are timed as the jobs run them (workers/training.py, workers/deletions.py): the training
set is moved from CPU to the device, the method trains (`fit`) or computes the update
(`workers.updates.compute_on`: the decision, the release, the accuracies), and the results come
back to CPU, ready to be committed. On cuda every timing ends with torch.cuda.synchronize().
Each figure is the p50 of `--repeats` runs (the first run, CUDA start-up and kernel loading
included, is one of them).

Datasets: digits (the service's builtin, 8×8 images) and the service's builtin "synthetic"
Gaussian mixture, 50,000 × 256, 10 classes (`--small`: 5,000 × 256), both split 80/20 as the
service splits them. Recollection precomputes one vector per sample, O(n²) work: it runs only
on training sets of at most `--recollection-max-n` samples (default: digits only), for the
logistic regression and the MLP (`--small`: the logistic regression only).

A case that fails (an exception, e.g. non-finite weights) is recorded with its error and the
run goes on.

    .venv/bin/python -m bench.device --device cpu|cuda [--small] [--repeats 3] [--out NAME]

Writes bench/results/device-<device>[-small].json (or NAME.json).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.core.formats.dataset_files import load_builtin
from app.core.schemas import BuiltinDatasetIn
from bench.common import device_info, model_spec, percentiles, update_inputs, write_result
from maths.training import accuracy
from methods import get_method
from methods.compute import (
    ModelSpec,
    PrivacyTarget,
    RemovedSamples,
    RetainedData,
    Trained,
    UpdateInputs,
    fit,
)
from workers.device import resolve_device, retained_to, synchronize, trained_to_cpu
from workers.updates import compute_on
from workers.values import Fallback

TARGET = PrivacyTarget(1.0, 1e-5)
TRAINING = {"epochs": 5, "batch_size": 128, "learning_rate": 0.1, "weight_decay": 5e-4, "seed": 0}
LOGREG: dict[str, Any] = {"type": "logreg"}
MLP: dict[str, Any] = {"type": "mlp", "hidden": [64, 64], "activation": "relu"}
RECOLLECTION: dict[str, Any] = {"name": "recollection", "max_relative_noise": None}
CONVEX = {  # bench/convex_head.py's options per dataset
    "digits": {"lam": 1e-3, "R": 9.0, "beta": 1e-3},
    "synthetic": {"lam": 1e-3, "R": 20.0, "beta": 1e-3},
}


def datasets(small: bool) -> dict[str, tuple[Any, int]]:
    """The service's builtin datasets (app/core/formats/dataset_files.py), as it builds them."""
    n = 5_000 if small else 50_000
    synthetic = BuiltinDatasetIn(builtin="synthetic", n_samples=n, n_features=256, n_classes=10)
    return {
        "digits": (load_builtin(BuiltinDatasetIn(builtin="digits")), 10),
        "synthetic": (load_builtin(synthetic), 10),
    }


def cases(dataset: str, n_train: int, args: argparse.Namespace) -> list[tuple[dict, dict]]:
    """(architecture, method) pairs to measure on this dataset."""
    out: list[tuple[dict, dict]] = [
        (LOGREG, {"name": "retrain"}),
        (MLP, {"name": "retrain"}),
        (MLP, {"name": "output_perturbation", "C0": 1.0, "finetune_epochs": 1}),
        (MLP, {"name": "noisy_finetune", "T": 200, "batch_size": 64}),
        (
            MLP,
            {
                "name": "newton",
                "depth": args.newton_depth,
                "chains": 10,
                "hvp_batch": 10,
                "max_relative_noise": None,
            },
        ),
        (
            {"type": "logreg", "feature_norm": CONVEX[dataset]["R"]},
            {"name": "convex_head", **CONVEX[dataset]},
        ),
    ]
    if n_train <= args.recollection_max_n:
        for arch in args.recollection_archs.split(","):
            out.append(({"logreg": LOGREG, "mlp": MLP}[arch], RECOLLECTION))
    return out


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    synchronize(device)
    start = time.perf_counter()
    result = fn()
    synchronize(device)
    return time.perf_counter() - start, result


def train_on(spec: ModelSpec, data: RetainedData, device: torch.device) -> Trained:
    """What `train_model` computes: data to the device, the method's training, back to CPU."""
    return trained_to_cpu(fit(spec, retained_to(data, device)))


def deletion_inputs(
    spec: ModelSpec,
    trained: Trained,
    data: RetainedData,
    test: RetainedData,
    victim: int,
) -> UpdateInputs:
    """One sample removed, loaded as `load.load_batch` loads it (CPU tensors; the
    sample's statistics when the method uses them)."""
    keep = torch.ones(len(data.y), dtype=torch.bool)
    keep[victim] = False
    sid = data.sample_ids[victim]
    statistics = {}
    if trained.statistics is not None and get_method(spec.method.name).uses_statistics:
        row = trained.statistics.sample_ids.index(sid)
        statistics = {sid: trained.statistics.vectors[row].float()}
    removed = RemovedSamples([sid], data.X[~keep], data.y[~keep], statistics)
    retained = RetainedData(
        [s for s, k in zip(data.sample_ids, keep.tolist(), strict=True) if k],
        data.X[keep],
        data.y[keep],
    )
    inputs = update_inputs(spec, trained.state, removed, retained, TARGET, test)
    return replace(inputs, record=trained.record or None)


def run_case(
    dataset: str,
    arch: dict,
    method: dict,
    data: RetainedData,
    test: RetainedData,
    n_classes: int,
    device: torch.device,
    args: argparse.Namespace,
) -> dict[str, Any]:
    n_features = int(np.prod(data.X.shape[1:]))
    spec = model_spec(arch, TRAINING, method, n_features, n_classes)
    train_times: list[float] = []
    trained: Trained | None = None
    for _ in range(args.repeats):
        seconds, trained = timed(device, lambda: train_on(spec, data, device))
        train_times.append(seconds)
    assert trained is not None
    victim = int(torch.randint(len(data.y), (1,), generator=torch.Generator().manual_seed(0)))
    inputs = deletion_inputs(spec, trained, data, test, victim)
    delete_times: list[float] = []
    outcome = None
    for _ in range(args.repeats):
        seconds, outcome = timed(device, lambda: compute_on(inputs, device))
        delete_times.append(seconds)
    assert outcome is not None
    decision = outcome.decision
    k = n_classes
    result = {
        "dataset": dataset,
        "architecture": arch,
        "method": method,
        "n_train": len(data.y),
        "n_features": n_features,
        "train_p50_s": float(np.median(train_times)),
        "train": percentiles(train_times),
        "deletion_p50_s": float(np.median(delete_times)),
        "deletion": percentiles(delete_times),
        "decision": decision.method,
        "fallback_reason": decision.reason if isinstance(decision, Fallback) else None,
        "update_metrics": {  # the last update's own figures (σ, LiSSA attempts, ...)
            key: value
            for key, value in outcome.metrics.items()
            if isinstance(value, (int, float, str)) and not isinstance(value, bool)
        },
        "trained_test_accuracy": accuracy(spec.architecture, trained.state, test.X, test.y, k),
        "release_test_accuracy": outcome.metrics.get("test_accuracy"),
    }
    print(
        f"{dataset:9s} {arch['type']:6s} {method['name']:19s} n={len(data.y):6d} "
        f"train p50 {result['train_p50_s']:8.3f}s  deletion p50 {result['deletion_p50_s']:8.3f}s"
        f"  [{decision.method}] test acc {result['release_test_accuracy']}",
        flush=True,
    )
    return result


def split(parsed: Any) -> tuple[RetainedData, RetainedData]:
    """The service's train/test split of a builtin dataset, as CPU tensors (sample ids 0..n−1)."""
    X = torch.from_numpy(parsed.X)
    y = torch.from_numpy(parsed.y)
    is_train = np.array([s == "train" for s in parsed.split])
    tr, te = np.flatnonzero(is_train), np.flatnonzero(~is_train)
    train = RetainedData(tr.tolist(), X[tr], y[tr])
    return train, RetainedData(te.tolist(), X[te], y[te])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="cpu")
    parser.add_argument("--small", action="store_true", help="synthetic 5,000 × 256, 2 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (--small: 2)")
    parser.add_argument("--newton-depth", type=int, default=None, help="default 1000 (small 100)")
    parser.add_argument("--recollection-max-n", type=int, default=2_000)
    parser.add_argument(
        "--recollection-archs", default=None, help="default logreg,mlp (--small: logreg)"
    )
    parser.add_argument("--datasets", default="digits,synthetic")
    parser.add_argument("--out", default=None, help="result name (default device-<device>)")
    args = parser.parse_args()
    args.repeats = args.repeats or (2 if args.small else 3)
    args.newton_depth = args.newton_depth or (100 if args.small else 1000)
    args.recollection_archs = args.recollection_archs or ("logreg" if args.small else "logreg,mlp")
    device = resolve_device(args.device)
    synchronize(device)
    started = time.perf_counter()
    loaded = datasets(args.small)
    results: list[dict[str, Any]] = []
    out = args.out or f"device-{device.type}" + ("-small" if args.small else "")

    def save(complete: bool) -> Path:
        return write_result(
            out,
            {
                "what": "per-method training and single-sample deletion compute on one device, "
                "timed as the jobs run them (CPU → device → CPU), p50 of the repeats",
                "command": "python -m bench.device "
                + f"--device {args.device}"
                + (" --small" if args.small else ""),
                "complete": complete,
                "device_info": device_info(str(device)),
                "training": TRAINING,
                "target": {"epsilon": TARGET.epsilon, "delta": TARGET.delta},
                "repeats": args.repeats,
                "newton_depth": args.newton_depth,
                "recollection_max_n": args.recollection_max_n,
                "total_seconds": time.perf_counter() - started,
                "results": results,
            },
        )

    for name in args.datasets.split(","):
        parsed, k = loaded[name]
        data, test = split(parsed)
        for arch, method in cases(name, len(data.y), args):
            try:
                results.append(run_case(name, arch, method, data, test, k, device, args))
            except Exception as exc:  # record it and go on: one case must not lose the run
                error = f"{type(exc).__name__}: {exc}"
                print(f"{name:9s} {arch['type']:6s} {method['name']:19s} FAILED: {error}")
                results.append(
                    {"dataset": name, "architecture": arch, "method": method, "error": error}
                )
            save(complete=False)  # a run cut short keeps what it measured
    path = save(complete=True)
    print(f"wrote {path} in {time.perf_counter() - started:.1f}s")


if __name__ == "__main__":
    main()
