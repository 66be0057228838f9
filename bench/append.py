"""Learning appended rows, side by side in one run.

In process (the maths, as a worker's resident session holds it): n synthetic rows × 256
features × 10 classes (bench/convex_resident.py's data and convex_head settings: λ = 1e-3,
R = 20, β = 1e-3, (ε, δ) = (1, 1e-5)); train; anchor the resident state (what the model's
first update or `warm_session` does); then learn k held-out rows of the same distribution
through `ConvexHead.unlearn` with `added` (the Hessian and gradient update, Newton steps under
the carried bound), against the exact retrain on the union the service runs (a cold solve,
issue 52) and a warm-started solve from the current state (the "exact warm retrain" earlier
benches timed). Test accuracy of the learned release against the exact optimum on the union.

With `--smaller K …`, appends of K of the same rows (the first K) are learned from the same
state too, each against a solve warm-started on its own union: below some size the carried
bound certifies the first Newton step and the learning reads no retained row.

Through the service (`--service`): an embedded `lethe serve` with a builtin synthetic dataset
of n rows and a trained convex_head model (one deletion first, so its session is warm); then
POST k rows (copies of training rows with a little noise, new ids) to
/v1/datasets/{id}/samples and time POST → learned version as a client sees it, beside the
update's own compute from the version's metrics. With `--appends N`, N appends in a row to
the same service (after 5 s idle or right after one more deletion, alternately).

    .venv/bin/python -m bench.append [--n 1000000] [--k 10000] [--service [--appends 1]]
        [--device cpu|cuda] [--repeats 1] [--smaller 1000 ...] [--out NAME]

In process with `--device cuda`, the rows, the resident state and every solve are on the GPU
(each timing ends with torch.cuda.synchronize()).
Writes bench/results/append.json (and append-service.json with --service), or NAME.json.
"""

from __future__ import annotations

import argparse
import io
import re
import resource
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.common import device_info, model_spec, write_result
from bench.convex_resident import OPTIONS, TARGET, TEST_ROWS, arrays, synthetic
from maths import convex
from maths.training import accuracy
from methods.compute import RetainedData, UpdateInputs, joined
from methods.convex_head.compute import ConvexHead, to_state, to_theta
from tests.support.factories import update_inputs
from workers.device import synchronize
from workers.resident import ModelSession


def in_process(
    n: int, k: int, device: torch.device, repeats: int = 1, smaller: tuple[int, ...] = ()
) -> dict[str, Any]:
    t0 = time.perf_counter()
    X_all, y_all, X_test, y_test = synthetic(n + k)
    X, y = X_all[:n].clone(), y_all[:n].clone()
    X_new, y_new = X_all[n:].clone().to(device), y_all[n:].clone().to(device)
    del X_all, y_all
    made = time.perf_counter() - t0
    spec = model_spec(
        {"type": "logreg", "feature_norm": OPTIONS["R"]}, {}, {"name": "convex_head", **OPTIONS},
        256, 10,
    )  # fmt: skip
    head = ConvexHead(spec)
    test = arrays(X_test, y_test, first_id=n + k)
    session = ModelSession.of(0, 1, arrays(X, y), {}, test, device)
    _, whole = session.split([], {}, [])
    t0 = time.perf_counter()
    trained = head.train(whole)
    synchronize(device)
    train_seconds = time.perf_counter() - t0
    print("trained in", round(train_seconds, 1), "s", flush=True)
    session = ModelSession.of(0, 1, arrays(X, y), dict(trained.state), test, device)
    _, retained = session.split([], {}, [])
    t0 = time.perf_counter()
    resident = head.prepare(retained, dict(trained.state))
    synchronize(device)
    anchor_seconds = time.perf_counter() - t0
    test_data = RetainedData(test.sample_ids, test.X.to(device), test.y.to(device))
    ids = list(range(n, n + k))
    added = RetainedData(ids, X_new, y_new, [None] * k, [str(i) for i in ids])
    removed, retained = session.split([], {}, [])
    inputs = replace(
        update_inputs(spec, dict(session.state), removed, joined(retained, added),
                      target=TARGET, test=test_data, model_id=0),
        resident=resident,
        added=added,
    )  # fmt: skip
    times = []
    for _ in range(repeats):  # the same update each time (`unlearn` makes a new state)
        synchronize(device)
        t0 = time.perf_counter()
        release = head.unlearn(inputs)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    learn_seconds, again = times[0], float(np.median(times[1:])) if repeats > 1 else None
    print("learned", k, "rows in", round(learn_seconds, 3), "s", release.metrics, flush=True)
    t0 = time.perf_counter()
    exact, _ = head.retrain(inputs)  # the service's exact retrain on the union (cold)
    synchronize(device)
    cold_seconds = time.perf_counter() - t0
    print("exact retrain (cold) in", round(cold_seconds, 1), "s", flush=True)
    o = head.options
    union = head.problem(inputs.retained)
    start = to_theta(trained.state).to(device)
    synchronize(device)
    t0 = time.perf_counter()
    warm = convex.solve(union, o.tolerance, o.max_iterations, start=start)
    synchronize(device)
    warm_seconds = time.perf_counter() - t0
    print("exact retrain (warm start) in", round(warm_seconds, 1), "s", flush=True)
    arch = spec.architecture
    X_t, y_t = test_data.X, test_data.y
    learned_acc = accuracy(arch, release.weights, X_t, y_t, 10)
    exact_acc = accuracy(arch, exact.state, X_t, y_t, 10)
    warm_acc = accuracy(arch, to_state(warm.theta), X_t, y_t, 10)
    fewer = []
    for rows in smaller:  # the first `rows` of the same appended rows, from the same state
        some = RetainedData(ids[:rows], X_new[:rows], y_new[:rows], [None] * rows,
                            [str(i) for i in ids[:rows]])  # fmt: skip
        fewer.append(smaller_append(head, inputs, retained, some, start, device, X_t, y_t))
    return {
        "n_train": n,
        "k_added": k,
        "n_test": TEST_ROWS,
        "data_seconds": made,
        "train_seconds": train_seconds,
        "anchor_seconds": anchor_seconds,
        "learn_compute_s": learn_seconds,
        "learn_metrics": {
            key: release.metrics[key]
            for key in ("newton_steps", "gradient_passes", "hessian_passes", "sigma")
        },
        "s_over_beta": release.certificate.constants["s"].value / o.beta,
        "exact_retrain_cold_s": cold_seconds,
        "exact_retrain_warm_start_s": warm_seconds,
        "speedup_vs_cold": cold_seconds / learn_seconds,
        "speedup_vs_warm_start": warm_seconds / learn_seconds,
        # the same update again, its kernels loaded and its buffers cached (`--repeats`)
        "learn_compute_repeats_s": times,
        "speedup_vs_warm_start_repeated": None if again is None else warm_seconds / again,
        "test_accuracy_learned_release": learned_acc,
        "test_accuracy_exact_optimum": exact_acc,
        "test_accuracy_warm_solve": warm_acc,
        "accuracy_gap_points": 100 * (exact_acc - learned_acc),
        # smaller appends to the same model (`--smaller`): against a warm-started solve on
        # their own union, whose optimum is the exact one (its accuracy the reference)
        "smaller_appends": fewer,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "device": device_info(device.type),
    }


def smaller_append(
    head: ConvexHead,
    inputs: UpdateInputs,
    retained: RetainedData,
    added: RetainedData,
    start: torch.Tensor,
    device: torch.device,
    X_t: torch.Tensor,
    y_t: torch.Tensor,
) -> dict[str, Any]:
    """Learning `added` from the same state and resident anchor, timed, against the solve
    warm-started from the trained weights on its own union (issue 55: below some size the
    carried bound certifies the first Newton step and no pass over the rows is made)."""
    smaller = replace(inputs, retained=joined(retained, added), added=added)
    synchronize(device)
    t0 = time.perf_counter()
    release = head.unlearn(smaller)
    synchronize(device)
    learn_seconds = time.perf_counter() - t0
    o = head.options
    t0 = time.perf_counter()
    warm = convex.solve(head.problem(smaller.retained), o.tolerance, o.max_iterations, start=start)
    synchronize(device)
    warm_seconds = time.perf_counter() - t0
    arch = head.model.architecture
    learned_acc = accuracy(arch, release.weights, X_t, y_t, 10)
    exact_acc = accuracy(arch, to_state(warm.theta), X_t, y_t, 10)
    print(f"learned {len(added)} rows in {learn_seconds:.3f} s, warm solve {warm_seconds:.1f} s",
          release.metrics, flush=True)  # fmt: skip
    return {
        "k_added": len(added),
        "learn_compute_s": learn_seconds,
        "learn_metrics": {
            key: release.metrics[key]
            for key in ("newton_steps", "gradient_passes", "hessian_passes")
        },
        "s_over_beta": release.certificate.constants["s"].value / o.beta,
        "exact_retrain_warm_start_s": warm_seconds,
        "speedup_vs_warm_start": warm_seconds / learn_seconds,
        "test_accuracy_learned_release": learned_acc,
        "test_accuracy_exact_optimum": exact_acc,
        "accuracy_gap_points": 100 * (exact_acc - learned_acc),
    }


def through_service(n: int, k: int, appends: int = 1) -> dict[str, Any]:
    """`appends` appends of k rows each to one million-row service: the first right after
    the deletion that warms the session (as a single run always was), then alternately after
    5 s idle and right after one more deletion. The top-level fields are the first's."""
    from app.client import Client
    from app.core.formats.dataset_files import load_builtin
    from app.core.schemas import BuiltinDatasetIn
    from bench.common import ready
    from tests.support.cluster import Cluster

    spec = {"builtin": "synthetic", "n_samples": n, "n_features": 256, "n_classes": 10}
    parsed = load_builtin(BuiltinDatasetIn.model_validate(spec))
    uploads = []
    for run in range(appends):  # copies of training rows with a little noise, new ids
        rng = np.random.default_rng(1 + run)
        rows = rng.choice(n, k, replace=False)
        X_new = parsed.X[rows] + 0.05 * rng.standard_normal((k, 256)).astype(np.float32)
        ids = [f"new-{i}" if run == 0 else f"new{run}-{i}" for i in range(k)]
        buffer = io.BytesIO()
        np.savez(buffer, X=X_new, y=parsed.y[rows], ids=np.array(ids))
        uploads.append(buffer.getvalue())
    train_ids = [parsed.ids[i] for i in range(n) if parsed.split[i] == "train"][:appends]
    del parsed
    limits = {
        "max_dataset_cells": n * 256 + 1,
        "max_dataset_samples": n,
        "job_timeout_seconds": 7200,
        # A worker that lived through an erasure gives way to a fresh one within the TTL
        # (workers/recycle.py), whose warming of the million-row session a job arriving then
        # waits for: 75 s in the sixth append of append-service-r16. That is the recycle's
        # cost, not the learning's: kept out of these runs.
        "plaintext_ttl_seconds": 3600,
    }
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), None, None, **limits) as cluster:
        c = Client(cluster.start_api(), cluster.admin_key, timeout=600)
        t0 = time.perf_counter()
        dataset = ready(c, c.post("/v1/datasets", json=spec))
        register_s = time.perf_counter() - t0
        body = {"name": "head", "dataset_id": dataset["id"], "architecture": {"type": "logreg"},
                "method": {"name": "convex_head", **OPTIONS}}  # fmt: skip
        t0 = time.perf_counter()
        model = c.wait_model(c.create_model(body).id)
        train_s = time.perf_counter() - t0
        print("registered", round(register_s), "s; trained", round(train_s), "s", flush=True)
        runs = []
        for run, upload in enumerate(uploads):
            after = "deletion" if run % 2 == 0 else "idle"
            if after == "deletion":  # the first: the session is warm now
                c.wait_deletion(c.delete(dataset["id"], [train_ids[run]]).id)
            else:
                time.sleep(5.0)
            one = _one_append(c, cluster.data_dir / "api.log", dataset["id"], model.id, upload)
            runs.append({"after": after, **one})
            print(run, after, {key: one[key] for key in list(one)[:6]}, flush=True)
        return {
            "n_samples": n,
            "k_added": k,
            "register_s": register_s,
            "train_s": train_s,
            **runs[0],
            "runs": runs,
            "runs_within_target": sum(r["within_target"] for r in runs),
        }


def _one_append(c: Any, log: Path, dataset_id: int, model_id: int, upload: bytes) -> dict[str, Any]:
    """POST one append and wait for its learned version (the long poll): the client's times
    beside the worker's and the POST's child's own accounts."""
    t0 = time.perf_counter()
    answer = c.post(f"/v1/datasets/{dataset_id}/samples", files={"file": ("new.npz", upload)})
    posted = time.perf_counter() - t0
    # the long poll answers when the worker's commit wakes it: no client polling beside the
    # compute (a GET every 10 ms took CPU from it on 2 cores)
    settled = c.wait_append(dataset_id, answer["id"], poll=30.0)
    post_to_learned = time.perf_counter() - t0
    version = c.model(model_id).current_version
    assert version is not None and version.kind == "learned", version
    m = version.metrics
    compute = float(m["unlearn_seconds"])
    phases = worker_phases(log)
    child = append_phases(log, answer["id"])
    return {
        "append_answer_s": posted,
        "post_to_learned_version_s": post_to_learned,
        "learn_compute_s": compute,
        "target_s": 1.5 * compute + 0.030,
        "within_target": post_to_learned <= 1.5 * compute + 0.030,
        "append_status": answer["status"],
        "rows_learned": settled.learning[0].n_added,
        # the worker's own account (its log): load, open, join, compute (with the release's
        # blobs and metrics), commit; the rest of POST -> learned version after the POST's
        # answer is the worker's wake-up (after the job before it) and the long poll's answer
        "worker_phases_s": phases,
        # the POST's child's own account (app/core/services/appends.py, its log line)
        "append_child_phases_s": child,
        "append_child_s": sum(child.values()),
        "unaccounted_s": post_to_learned - posted - sum(phases.values()),
        "metrics": {
            key: m.get(key)
            for key in (
                "newton_steps",
                "gradient_passes",
                "hessian_passes",
                "test_accuracy",
                "rows_loaded",
                "method",
            )  # fmt: skip
        },
    }


def worker_phases(log: Path) -> dict[str, float]:
    """The phases of the last learned version, from the worker's log line
    (workers/learning.py, `app.core.phases.Phases`)."""
    lines = [line for line in log.read_text().splitlines() if " rows of appends " in line]
    if not lines:
        return {}
    account = lines[-1].split(": ")[-1]
    return {p: float(s) for p, s in re.findall(r"(\w+) ([0-9.]+) s", account)}


def append_phases(log: Path, append_id: int) -> dict[str, float]:
    """The phases of the append's child, from its log line (app/core/services/appends.py)."""
    lines = [line for line in log.read_text().splitlines() if f"append {append_id}: " in line]
    if not lines:
        return {}
    account = lines[-1].split(" rows: ")[-1]
    return {p: float(s) for p, s in re.findall(r"(\w+) ([0-9.]+) s", account)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10_000)
    parser.add_argument("--service", action="store_true", help="through the service instead")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="in process")
    parser.add_argument("--out", default=None, help="the result's name (default: append)")
    parser.add_argument("--repeats", type=int, default=1, help="the learning step, timed again")
    parser.add_argument("--appends", type=int, default=1, help="with --service: appends in a row")
    parser.add_argument(
        "--smaller", type=int, nargs="*", default=[], help="in process: smaller appends too"
    )
    args = parser.parse_args()
    if args.service:
        found = through_service(args.n, args.k, args.appends)
        write_result(args.out or "append-service", found)
    else:
        result = {"options": OPTIONS, "target": {"epsilon": TARGET.epsilon, "delta": TARGET.delta}}
        device = torch.device(args.device)
        learned = in_process(args.n, args.k, device, args.repeats, tuple(args.smaller))
        write_result(args.out or "append", result | learned)


if __name__ == "__main__":
    main()
