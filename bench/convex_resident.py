"""convex_head's removal with its resident state, against the same code's
exact warm retrain, both on rows already in memory (a worker's resident session).

For n = 100,000 and 1,000,000 synthetic rows × 256 features × 10 classes at (ε, δ) = (1, 1e-5),
λ = 1e-3, R = 20, β = 1e-3 (bench/convex_head.py's settings): train; time the exact warm
retrain (`ConvexHead.retrain`, what a fallback or an explicit retrain runs) on a single-sample
removal; then 20 sequential single-sample removals through `ConvexHead.unlearn` with its
resident state carried from one to the next, exactly as the job does (workers/resident.py:
split, then advance after the "commit"), and one 10,000-sample batch. Per request: compute,
passes over the retained rows, s/β. At the end: test accuracy of the last release against the
exact optimum on the same retained rows.

    .venv/bin/python -m bench.convex_resident [--sizes 100000 1000000] [--requests 20]
        [--device cpu|cuda] [--out convex_resident] [--profile]

Writes bench/results/<out>.json. With `--device cuda` the rows, the resident state and both
computations are on the GPU (as a GPU worker's session keeps them); every timing ends with a
synchronize. `--profile` also profiles one steady single removal (torch.profiler, CPU and,
on cuda, the GPU): its operators by self time, how many it ran and how many made the host wait
for the device (a tensor read back as a Python number).
"""

from __future__ import annotations

import argparse
import resource
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from sklearn import datasets as skd

from bench.common import device_info, model_spec, write_result
from maths.training import accuracy
from methods.compute import PrivacyTarget, RetainedData, UpdateInputs
from methods.convex_head.compute import ConvexHead, ShiftOverBudget
from tests.support.factories import update_inputs
from workers.data import Arrays
from workers.device import synchronize
from workers.resident import ModelSession

TARGET = PrivacyTarget(1.0, 1e-5)
OPTIONS = {"lam": 1e-3, "R": 20.0, "beta": 1e-3}
TEST_ROWS = 20_000


def synthetic(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    X, y = skd.make_classification(
        n_samples=n + TEST_ROWS,
        n_features=256,
        n_informative=20,
        n_redundant=0,
        n_classes=10,
        n_clusters_per_class=1,
        random_state=0,
    )
    X32 = torch.from_numpy(X.astype(np.float32))
    del X
    y_t = torch.from_numpy(y)
    return X32[:n].clone(), y_t[:n].clone(), X32[n:].clone(), y_t[n:].clone()


def arrays(X: torch.Tensor, y: torch.Tensor, first_id: int = 0) -> Arrays:
    ids = list(range(first_id, first_id + len(y)))
    return Arrays(ids, [str(i) for i in ids], X, y, [None] * len(y))


def profiled(head: ConvexHead, inputs: UpdateInputs, device: torch.device) -> dict[str, Any]:
    """One removal under torch.profiler: the operators by self time (CPU, and the device's on
    cuda), how many ran, and how many read a tensor back to the host (each one a wait)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    started = time.perf_counter()
    with profile(activities=activities) as prof:
        head.unlearn(inputs)
        synchronize(device)
    wall = time.perf_counter() - started
    events = prof.key_averages()
    device_time = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"

    def top(key: str) -> list[dict[str, Any]]:
        ranked = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:25]
        return [
            {
                "op": e.key,
                "calls": e.count,
                "self_cpu_ms": e.self_cpu_time_total / 1e3,
                "self_device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3,
            }
            for e in ranked
        ]

    aten = [e for e in events if e.key.startswith("aten::")]
    return {
        "wall_s_profiled": wall,
        "aten_calls": sum(e.count for e in aten),
        "host_reads": sum(e.count for e in events if e.key == "aten::_local_scalar_dense"),
        # on cuda: copies back to the host and explicit waits (each one drains the queue)
        "device_to_host_copies": sum(e.count for e in events if "DtoH" in e.key),
        "synchronize_calls": sum(e.count for e in events if "Synchronize" in e.key),
        "by_self_cpu": top("self_cpu_time_total"),
        "by_self_device": top(device_time),
    }


def run(
    n: int, requests: int, batch: int, retrains: int, device: torch.device, profile: bool = False
) -> dict[str, Any]:
    def clock() -> float:
        synchronize(device)
        return time.perf_counter()

    started = time.perf_counter()
    X, y, X_test, y_test = synthetic(n)
    made = time.perf_counter() - started
    spec = model_spec(
        {"type": "logreg", "feature_norm": OPTIONS["R"]},
        {},
        {"name": "convex_head", **OPTIONS},
        256,
        10,
    )
    head = ConvexHead(spec)
    test = arrays(X_test, y_test, first_id=n)
    session = ModelSession.of(0, 1, arrays(X, y), {}, test, device)
    start = clock()
    _, whole = session.split([], {}, [])
    trained = head.train(whole)
    train_seconds = clock() - start
    print(n, "trained in", round(train_seconds, 1), "s", flush=True)
    session = ModelSession.of(0, 1, arrays(X, y), dict(trained.state), test, device)
    test = session.test
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
    test_data = RetainedData(test.sample_ids, test.X, test.y)

    def inputs_for(ids: list[int], resident: object | None) -> UpdateInputs:
        removed, retained = session.split(ids, {}, [])
        made = update_inputs(spec, dict(session.state), removed, retained, target=TARGET,
                             test=test_data, model_id=0)  # fmt: skip
        return replace(made, resident=resident)

    # The exact warm retrain, on single-sample removals from the trained state.
    retrain_seconds = []
    for r in range(retrains):
        inputs = inputs_for([order[-1 - r]], None)
        t0 = clock()
        head.retrain(inputs)
        retrain_seconds.append(clock() - t0)
    print(n, "warm retrains", retrain_seconds, flush=True)

    per_request: list[dict[str, Any]] = []
    resident: object | None = None
    version = 1
    profile_row = None
    for r in range(requests + 1):
        if r == requests and profile:  # a steady single removal, not kept
            profile_row = profiled(head, inputs_for([order[-1]], resident), device)
        ids = [order[r]] if r < requests else order[requests : requests + batch]
        inputs = inputs_for(ids, resident)
        t0 = clock()
        try:
            release = head.unlearn(inputs)
        except ShiftOverBudget:
            per_request.append({"request": r + 1, "removed": len(ids), "fallback": True,
                                "compute_s": clock() - t0})  # fmt: skip
            break
        compute = clock() - t0
        t1 = clock()
        version += 1
        session = session.advance(version, ids, dict(release.next_state), release.resident)
        advance = clock() - t1
        resident = release.resident
        row = {
            "request": r + 1,
            "removed": len(ids),
            "compute_s": compute,
            "advance_s": advance,
            "s_over_beta": release.certificate.constants["s"].value / OPTIONS["beta"],
            "newton_steps": release.metrics["newton_steps"],
            "gradient_passes": release.metrics["gradient_passes"],
            "hessian_passes": release.metrics["hessian_passes"],
        }
        per_request.append(row)
        print(n, row, flush=True)
    last_weights = release.weights
    # The exact optimum on the same retained rows, for accuracy (warm retrain of the last).
    _, retained = session.split([], {}, [])
    exact, _ = head.retrain(update_inputs(spec, dict(session.state), inputs.removed, retained,
                                          target=TARGET, test=test_data, model_id=0))  # fmt: skip
    arch = spec.architecture
    release_acc = accuracy(arch, last_weights, test.X, test.y, 10)
    exact_acc = accuracy(arch, exact.state, test.X, test.y, 10)
    singles = [p for p in per_request[1:requests] if not p.get("fallback")]
    steady = float(np.median([p["compute_s"] for p in singles])) if singles else None
    all_singles = [p["compute_s"] for p in per_request[:requests] if not p.get("fallback")]
    retrain_p50 = float(np.median(retrain_seconds))
    return {
        "n_train": n,
        "n_test": TEST_ROWS,
        "data_seconds": made,
        "train_seconds": train_seconds,
        "train_gradient_norm": trained.metrics["gradient_norm"],
        "exact_warm_retrain_s": retrain_seconds,
        "exact_warm_retrain_p50_s": retrain_p50,
        "first_removal_s": per_request[0]["compute_s"],
        "single_removal_p50_s": steady,
        "single_removal_mean_s_with_first": float(np.mean(all_singles)),
        "speedup_p50": retrain_p50 / steady if steady else None,
        "speedup_mean_with_first": retrain_p50 / float(np.mean(all_singles)),
        "batch_removal": per_request[-1] if len(per_request) > requests else None,
        "test_accuracy_release": release_acc,
        "test_accuracy_exact": exact_acc,
        "accuracy_gap_points": None
        if release_acc is None or exact_acc is None
        else 100 * (exact_acc - release_acc),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "per_request": per_request,
        "profile": profile_row,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--retrains", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--out", default="convex_resident", help="bench/results/<out>.json")
    parser.add_argument("--profile", action="store_true", help="profile one steady removal")
    args = parser.parse_args()
    device = torch.device(args.device)
    sizes = {
        str(n): run(n, args.requests, args.batch, args.retrains, device, args.profile)
        for n in args.sizes
    }
    results = {
        "target": {"epsilon": TARGET.epsilon, "delta": TARGET.delta},
        "options": OPTIONS,
        "torch_threads": torch.get_num_threads(),
        "device": device_info(args.device),
        "sizes": sizes,
    }
    write_result(args.out, results)


if __name__ == "__main__":
    main()
