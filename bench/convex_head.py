"""convex_head: speed, accuracy and the measured shift over a sequence of requests.

For each dataset (synthetic n=100,000 p=256 10 classes; digits; breast_cancer features), at
(ε, δ) = (1, 1e-5): train the head, then run 100 sequential single-sample removals through the
method (workers/methods/convex_head.py, the same code the job runs, with the lineage
accountant the job uses). Per request: the method's compute, the measured shift s against β,
the lineage ε. At 1, 10 and 100 requests: test accuracy of the release against the exact
retrained optimum, and the time of a cold and of a warm-started exact retrain (the honest
baselines). Also: how many requests fit the default lineage budget (ε = 10, δ = 1e-4).

    .venv/bin/python -m bench.convex_head [--requests 100] [--quick]

Writes bench/results/convex_head.json and convex_head.png (s/β over the sequence).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn import datasets as skd
from sklearn.model_selection import train_test_split

from app.core.specs import PrivacyPolicy
from app.privacy.lineage import LineageBudget, admit
from bench.common import RESULTS, model_spec, ready, write_result
from maths import convex
from maths.training import accuracy
from methods.compute import PrivacyTarget, RemovedSamples, RetainedData
from methods.convex_head.compute import ConvexHead, ShiftOverBudget, to_state, to_theta
from tests.support.factories import update_inputs

TARGET = PrivacyTarget(1.0, 1e-5)
CHECKPOINTS = (1, 10, 100)


def load(name: str, quick: bool) -> tuple[np.ndarray, np.ndarray, int]:
    if name == "synthetic":
        n = 20_000 if quick else 100_000
        X, y = skd.make_classification(
            n_samples=n,
            n_features=256,
            n_informative=20,
            n_redundant=0,
            n_classes=10,
            n_clusters_per_class=1,
            random_state=0,
        )
        return X.astype(np.float32), y, 10
    if name == "digits":
        bunch = skd.load_digits()
        return (bunch.data / 16.0).astype(np.float32), bunch.target, 10
    bunch = skd.load_breast_cancer()
    X = (bunch.data - bunch.data.mean(0)) / bunch.data.std(0)
    return X.astype(np.float32), bunch.target, 2


OPTIONS = {
    "synthetic": {"lam": 1e-3, "R": 20.0, "beta": 1e-3},
    "digits": {"lam": 1e-3, "R": 9.0, "beta": 1e-3},
    "breast_cancer": {"lam": 1e-3, "R": 12.0, "beta": 1e-3},
}


def run(name: str, requests: int, quick: bool) -> dict[str, Any]:
    X, y, k = load(name, quick)
    Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.2, random_state=0, stratify=y)
    Xtr_t, ytr_t = torch.from_numpy(Xtr), torch.from_numpy(ytr)
    test = RetainedData([], torch.from_numpy(Xte), torch.from_numpy(yte))
    method_json = {"name": "convex_head", **OPTIONS[name]}
    arch = {"type": "logreg", "feature_norm": OPTIONS[name]["R"]}
    spec = model_spec(arch, {}, method_json, X.shape[1], k)
    head = ConvexHead(spec)
    ids = list(range(len(ytr)))

    start = time.perf_counter()
    trained = head.train(RetainedData(ids, Xtr_t, ytr_t))
    train_seconds = time.perf_counter() - start
    state = trained.state
    policy = PrivacyPolicy(epsilon=1.0, delta=1e-5)
    budget = LineageBudget(policy.lineage_epsilon, policy.lineage_delta)
    history: list[Any] = []
    keep = torch.ones(len(ytr), dtype=torch.bool)
    order = torch.randperm(len(ytr), generator=torch.Generator().manual_seed(0))
    per_request: list[dict[str, Any]] = []
    checkpoints: list[dict[str, Any]] = []
    budget_exhausted_at: int | None = None
    retrains = 0
    fallbacks = 0
    for r in range(requests):
        victim = int(order[r])
        keep[victim] = False
        retained = RetainedData(
            [i for i in ids if keep[i]], Xtr_t[keep], ytr_t[keep]
        )  # fmt: skip
        removed = RemovedSamples([victim], Xtr_t[victim : victim + 1], ytr_t[victim : victim + 1])
        inputs = update_inputs(
            spec,
            state,
            removed,
            retained,
            policy=policy,
            target=TARGET,
            test=test,
            history=list(history),
            model_id=0,
        )
        t0 = time.perf_counter()
        try:
            release = head.unlearn(inputs)
        except ShiftOverBudget as over:  # what the job does: an exact retrain
            fallbacks += 1
            o = head.options
            solved = convex.solve(
                convex.Problem.of(retained.X, retained.y, k, o.R, o.lam),
                o.tolerance,
                o.max_iterations,
            )
            state, history = to_state(solved.theta), []
            per_request.append(
                {"request": r + 1, "compute_s": time.perf_counter() - t0, "s": over.shift,
                 "s_over_beta": over.shift / o.beta, "fallback": True}
            )  # fmt: skip
            continue
        compute = time.perf_counter() - t0
        admission = admit(budget, history, release.event)
        if admission.admitted:
            history.append(release.event)
            state = release.next_state
        else:  # what the job does: an exact (here warm-started) retrain resets the lineage
            budget_exhausted_at = budget_exhausted_at or r + 1
            retrains += 1
            o = head.options
            problem = convex.Problem.of(retained.X, retained.y, k, o.R, o.lam)
            solved = convex.solve(problem, o.tolerance, o.max_iterations, start=to_theta(state))
            state, history = to_state(solved.theta), []
        per_request.append(
            {
                "request": r + 1,
                "compute_s": compute,
                "s": release.certificate.constants["s"].value,
                "s_over_beta": release.certificate.constants["s"].value / head.options.beta,
                "newton_steps": release.metrics["newton_steps"],
                "lineage_epsilon": admission.after.epsilon,
                "admitted": admission.admitted,
            }
        )
        if r + 1 in CHECKPOINTS:
            checkpoints.append(checkpoint(head, spec, release, retained, test, state, r + 1))
            print(name, checkpoints[-1], flush=True)
    computes = [p["compute_s"] for p in per_request if not p.get("fallback")]
    return {
        "n_train": len(ytr),
        "n_features": X.shape[1],
        "n_classes": k,
        "options": OPTIONS[name],
        "train_seconds": train_seconds,
        "train_gradient_norm": trained.metrics["gradient_norm"],
        "sigma": release.certificate.sigma,
        "compute_p50_s": float(np.median(computes)),
        "checkpoints": checkpoints,
        "requests_until_lineage_budget": budget_exhausted_at,
        "exact_retrains_forced_by_budget": retrains,
        "exact_retrains_forced_by_shift": fallbacks,
        "per_request": per_request,
    }


def checkpoint(
    head: ConvexHead,
    spec: Any,
    release: Any,
    retained: RetainedData,
    test: RetainedData,
    state: dict[str, torch.Tensor],
    r: int,
) -> dict[str, Any]:
    o = head.options
    problem = convex.Problem.of(retained.X, retained.y, spec.n_classes, o.R, o.lam)
    t0 = time.perf_counter()
    cold = convex.solve(problem, o.tolerance, o.max_iterations)
    cold_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = convex.solve(problem, o.tolerance, o.max_iterations, start=to_theta(state))
    warm_s = time.perf_counter() - t0
    arch, k = spec.architecture, spec.n_classes
    return {
        "requests": r,
        "release_test_accuracy": accuracy(arch, release.weights, test.X, test.y, k),
        "retrained_test_accuracy": accuracy(arch, to_state(cold.theta), test.X, test.y, k),
        "distance_to_optimum": float(torch.linalg.norm(to_theta(state) - cold.theta)),
        "s": release.certificate.constants["s"].value,
        "cold_retrain_s": cold_s,
        "warm_retrain_s": warm_s,
        "retrain_gradient_norms": {"cold": cold.gradient_norm, "warm": warm.gradient_norm},
    }


SERVICE_DATASETS = {
    "digits": {"builtin": "digits"},
    "synthetic": {"builtin": "synthetic", "n_samples": 100_000, "n_features": 256, "n_classes": 10},
}


def service(name: str, requests: int, tmp: Path) -> dict[str, Any]:
    """Through the real service (embedded: SQLite + inline worker): registration, training,
    and POST→certificate of sequential single-sample requests, convex_head vs asking for an
    exact retrain (`"method": "retrain"`, the model's own cold solve)."""
    from app.client import Client
    from bench.common import embedded_server, percentiles

    out: dict[str, Any] = {}
    with embedded_server(tmp / name) as (url, key):
        c = Client(url, key, timeout=3600)
        t0 = time.perf_counter()
        ds = ready(c, c.post("/v1/datasets", json=SERVICE_DATASETS[name]))
        out["register_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        model = c.post(
            "/v1/models",
            json={
                "name": name,
                "dataset_id": ds["id"],
                "architecture": {"type": "logreg"},
                "method": {"name": "convex_head", **OPTIONS[name]},
                "privacy": {"epsilon": 1.0, "delta": 1e-5},
            },
        )
        model = c.wait_model(model["id"]).model_dump(mode="json")
        out["train_s"] = time.perf_counter() - t0
        ids = [
            s["external_id"]
            for s in c.get(
                f"/v1/datasets/{ds['id']}/samples",
                params={"split": "train", "limit": 2 * requests},
            )["items"]
        ]
        for label, method in (("convex_head", None), ("retrain", "retrain")):
            latencies, methods = [], []
            for sample in ids[:requests] if method is None else ids[requests:]:
                body: dict[str, Any] = {"dataset_id": ds["id"], "sample_ids": [sample]}
                if method:
                    body["method"] = method
                t0 = time.perf_counter()
                done = c.wait_deletion(c.post("/v1/deletions", json=body)["id"]).model_dump(
                    mode="json"
                )
                latencies.append(time.perf_counter() - t0)
                cert = c.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}")
                methods.append(cert["method"])
            out[label] = {"post_to_certificate": percentiles(latencies), "methods": methods}
        print(name, "service", out, flush=True)
    return out


def plot(results: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, res in results["datasets"].items():
        xs = [p["request"] for p in res["per_request"]]
        ax.semilogy(xs, [p["s_over_beta"] for p in res["per_request"]], label=name)
    ax.axhline(1.0, color="k", linestyle="--", label="β (above: exact retrain)")
    ax.set_xlabel("sequential single-sample request")
    ax.set_ylabel("measured shift s / β")
    ax.set_title("convex_head: measured shift against the budget, (ε, δ) = (1, 1e-5)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "convex_head.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="synthetic n = 20,000")
    parser.add_argument("--service-requests", type=int, default=10)
    parser.add_argument(
        "--service-only", action="store_true", help="keep the method runs of the last JSON"
    )
    args = parser.parse_args()
    results: dict[str, Any] = {"target": {"epsilon": 1.0, "delta": 1e-5}, "datasets": {}}
    if args.service_only:
        previous = json.loads((RESULTS / "convex_head.json").read_text())
        results["datasets"] = previous["datasets"]
    else:
        for name in ("breast_cancer", "digits", "synthetic"):
            results["datasets"][name] = run(name, args.requests, args.quick)
        write_result("convex_head", results)
        plot(results)
    results["service"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in SERVICE_DATASETS:
            results["service"][name] = service(name, args.service_requests, Path(tmp))
    write_result("convex_head", results)


if __name__ == "__main__":
    main()
