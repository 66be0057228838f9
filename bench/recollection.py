"""Recollection (seed 003) on digits through the embedded service: precompute cost, storage,
per-request unlearning time against retraining, and accuracy / distance / membership inference
against the coupled retrain after removing 1%, 5% and 20% of the training data one request at
a time.

    .venv/bin/python -m bench.recollection [--archs logreg,mlp] [--epochs 20]

Writes bench/results/recollection.json and bench/results/recollection.md.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load as st_load
from sklearn.datasets import load_digits
from sqlalchemy import select

from app.client import Client
from app.core.db.tables import Model, ModelVersion, Sample
from app.core.runtime import Runtime
from app.core.settings import Settings
from bench.common import RESULTS, embedded_server, percentiles, write_result
from maths.evaluation import membership_auc, per_sample_losses
from maths.nets import FlatModel, build_net
from maths.training import accuracy, train
from methods.recollection.maths import train_recollection
from tests.support.factories import stored_bytes
from workers.statistics import read_vectors

ARCHS = {
    "logreg": {"type": "logreg"},
    "mlp": {"type": "mlp", "hidden": [64, 64], "activation": "relu"},
}
FRACTIONS = (0.01, 0.05, 0.20)
PAPER_TABLE1 = [  # seed 003 Table 1, "Proposed" rows (note 003 §8.3, exponents restored)
    ("MNIST", "LR", "2.74e-3 s total / ~14 µs per request", "448,060×", "0.03", "-0.50"),
    ("MNIST", "CNN", "3.2e-2 s total / ~0.16 ms per request", "9,940×", "0.08", "-2.25"),
    ("FMNIST", "CNN", "0.127 s total / ~0.16 ms per request", "98,468×", "0.32", "-2.09"),
    ("FMNIST", "LeNet", "0.163 s total / ~0.2 ms per request", "79,828×", "0.48", "-1.87"),
]


def _runtime(db: Path) -> Runtime:
    """The server's SQLite file and its master key (everything in it is sealed)."""
    return Runtime.build(Settings(data_dir=db.parent, database_url=f"sqlite:///{db}"))


def noise_free_state(db: Path, model_id: int) -> dict[str, torch.Tensor]:
    runtime = _runtime(db)
    with runtime.db.read() as session:
        model = session.get(Model, model_id)
        assert model is not None
        version = session.get(ModelVersion, model.current_version_id)
        assert version is not None and version.state_key is not None
        data = stored_bytes(runtime.blobs, session, version.state_key)
    assert data is not None
    return dict(st_load(data))


def stored_vectors(db: Path, model_id: int, sample_ids: list[int]) -> torch.Tensor:
    runtime = _runtime(db)
    with runtime.db.read() as session:
        vectors = read_vectors(session, runtime.keyring, model_id, sample_ids)
    return torch.stack([vectors[s] for s in sample_ids])


def sample_ids_by_external(db: Path, dataset_id: int, externals: list[str]) -> dict[str, int]:
    """External id -> internal id, through the keyed tokens the database stores."""
    runtime = _runtime(db)
    with runtime.db.read() as session:
        ring = runtime.keyring
        tokens = {ring.token("sample", dataset_id, e): e for e in externals}
        rows = session.execute(
            select(Sample.external_id, Sample.id).where(Sample.dataset_id == dataset_id)
        ).all()
    return {tokens[t]: sid for t, sid in rows if t in tokens}


def run_arch(name: str, epochs: int, tmp: Path) -> dict:
    arch = ARCHS[name]
    config = {
        "epochs": epochs,
        "batch_size": 64,
        "learning_rate": 0.1,
        "weight_decay": 1e-3,
        "seed": 0,
    }
    digits = load_digits()
    X_all = torch.tensor(digits.images / 16.0, dtype=torch.float32)
    y_all = torch.tensor(digits.target)
    with embedded_server(tmp / name) as (url, key):
        c = Client(url, key, timeout=3600)
        ds = c.post("/v1/datasets", json={"builtin": "digits"})
        train_page = [
            s
            for off in range(0, 1437, 1000)
            for s in c.get(
                f"/v1/datasets/{ds['id']}/samples",
                params={"split": "train", "limit": 1000, "offset": off},
            )["items"]
        ]
        test_page = c.get(
            f"/v1/datasets/{ds['id']}/samples", params={"split": "test", "limit": 1000}
        )["items"]
        train_idx = torch.tensor([int(s["external_id"]) for s in train_page])
        test_idx = torch.tensor([int(s["external_id"]) for s in test_page])
        Xtr, ytr, Xte, yte = X_all[train_idx], y_all[train_idx], X_all[test_idx], y_all[test_idx]

        train(arch, config, Xtr, ytr, 10)  # warm up torch before timing
        t0 = time.perf_counter()
        train(arch, config, Xtr, ytr, 10)
        plain_seconds = time.perf_counter() - t0

        t0 = time.perf_counter()
        model = c.post(
            "/v1/models",
            json={
                "name": f"rec-{name}",
                "dataset_id": ds["id"],
                "architecture": arch,
                "training": config,
                "method": {"name": "recollection", "max_relative_noise": None},
                # hundreds of single-sample releases: a budget large enough to measure them all
                "privacy": {
                    "epsilon": 1.0,
                    "delta": 1e-5,
                    "lineage_epsilon": 1000.0,
                    "lineage_delta": 1e-4,
                },
            },
        )
        model = c.wait_model(model["id"]).model_dump(mode="json")
        assert model["status"] == "ready", model
        post_to_ready = time.perf_counter() - t0
        v1 = model["current_version"]["metrics"]
        record = v1["record"]
        db = tmp / name / "lethe.db"
        w0 = noise_free_state(db, model["id"])

        # sample ids in the service, in the record's training order
        by_external = sample_ids_by_external(
            db, ds["id"], [s["external_id"] for s in train_page + test_page]
        )
        order = record["train_sample_ids"]
        position = {sid: i for i, sid in enumerate(order)}
        Xo = torch.stack([X_all[int(e)] for e in _externals(by_external, order)])
        yo = torch.stack([y_all[int(e)] for e in _externals(by_external, order)])

        rng = np.random.default_rng(0)
        queue = [s["external_id"] for s in train_page]
        rng.shuffle(queue)
        n = len(queue)
        checkpoints = {math.ceil(f * n): f for f in FRACTIONS}
        fp16 = _fp16_error(
            db, model["id"], [by_external[e] for e in queue[: checkpoints_min(checkpoints)]]
        )

        latencies, computes, sigmas, epsilons, removed, results = [], [], [], [], [], []
        for k, external in enumerate(queue[: max(checkpoints)], start=1):
            t0 = time.perf_counter()
            req = c.post("/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": [external]})
            req = c.wait_deletion(req["id"]).model_dump(mode="json")
            latencies.append(time.perf_counter() - t0)
            assert req["status"] == "done", req
            cert = c.get(f"/v1/audit/certificates/{req['certificate_ids'][0]}")
            assert cert["method"] == "recollection", cert.get("fallback_reason")
            version = c.get(f"/v1/models/{model['id']}/versions/{req['models'][0]['version']}")
            computes.append(version["metrics"]["unlearn_compute_seconds"])
            sigmas.append(cert["sigma"])
            epsilons.append(cert["epsilon"])
            removed.append(by_external[external])
            if k in checkpoints:
                results.append(
                    _checkpoint(
                        c,
                        db,
                        model["id"],
                        arch,
                        config,
                        record,
                        w0,
                        Xo,
                        yo,
                        [position[s] for s in removed],
                        Xte,
                        yte,
                        checkpoints[k],
                        k,
                        cert,
                    )
                )
    retrain_seconds = plain_seconds
    per_request = percentiles(computes)
    return {
        "architecture": name,
        "d": record["d"],
        "n_train": n,
        "epochs": epochs,
        "plain_training_seconds": plain_seconds,
        "precompute_seconds": record["precompute_seconds"],
        "precompute_ratio": record["precompute_seconds"] / plain_seconds,
        "post_to_ready_seconds": post_to_ready,
        "storage_bytes_float32": v1["statistics_bytes"],
        "storage_bytes_float16": v1["statistics_bytes"] // 2,
        "float16_relative_error_of_sum": fp16,
        "rho": record["rho"],
        "clipped_steps": record["clipped_steps"],
        "retrain_seconds": retrain_seconds,
        "unlearn_compute_seconds": per_request,
        "post_to_certificate_seconds": percentiles(latencies),
        "speedup_compute_p50": retrain_seconds / per_request["p50"],
        "speedup_service_p50": retrain_seconds / percentiles(latencies)["p50"],
        "sigma_range": [min(sigmas), max(sigmas)],
        "epsilon_per_release": epsilons[-1],
        "test_accuracy_v1": v1["test_accuracy"],
        "checkpoints": results,
    }


def _externals(by_external: dict[str, int], order: list[int]) -> list[str]:
    inverse = {v: k for k, v in by_external.items()}
    return [inverse[s] for s in order]


def checkpoints_min(checkpoints: dict[int, float]) -> int:
    return min(checkpoints)


def _fp16_error(db: Path, model_id: int, sample_ids: list[int]) -> float:
    vectors = stored_vectors(db, model_id, sample_ids)
    exact = vectors.double().sum(0)
    half = vectors.half().double().sum(0)
    return float((half - exact).norm() / exact.norm())


def _checkpoint(
    c: Client,
    db: Path,
    model_id: int,
    arch: dict,
    config: dict,
    record: dict,
    w0: dict,
    Xo: torch.Tensor,
    yo: torch.Tensor,
    removed_pos: list[int],
    Xte: torch.Tensor,
    yte: torch.Tensor,
    fraction: float,
    k: int,
    cert: dict,
) -> dict:
    exclude = torch.zeros(len(yo), dtype=torch.bool)
    exclude[removed_pos] = True
    coupled = train_recollection(
        arch,
        config,
        record["C"],
        record["q"],
        Xo,
        yo,
        10,
        record=False,
        exclude=exclude,
        rho_checks=1,
    ).state
    plain = train(arch, config, Xo[~exclude], yo[~exclude], 10)
    noise_free = noise_free_state(db, model_id)
    released = dict(st_load(c.request("GET", f"/v1/models/{model_id}/weights").content))
    names = FlatModel(build_net(arch, 64, 10)).names

    def flat(s: dict) -> torch.Tensor:
        return torch.cat([s[n].reshape(-1).double() for n in names])

    def auc(state: dict) -> float | None:
        return membership_auc(
            per_sample_losses(arch, state, Xo[exclude], yo[exclude], 10),
            per_sample_losses(arch, state, Xte, yte, 10),
        )

    gap = float((flat(w0) - flat(coupled)).norm())
    return {
        "fraction": fraction,
        "removed": k,
        "test_accuracy": {
            "released": accuracy(arch, released, Xte, yte, 10),
            "noise_free": accuracy(arch, noise_free, Xte, yte, 10),
            "coupled_retrain": accuracy(arch, coupled, Xte, yte, 10),
            "plain_retrain": accuracy(arch, plain, Xte, yte, 10),
        },
        "distance_to_coupled_retrain": {
            "noise_free": float((flat(noise_free) - flat(coupled)).norm()),
            "original": gap,
            "relative": float((flat(noise_free) - flat(coupled)).norm()) / gap,
        },
        "mia_auc": {
            "noise_free": auc(noise_free),
            "released": auc(released),
            "coupled_retrain": auc(coupled),
            "original": auc(w0),
        },
        "certificate": {
            "epsilon": cert["epsilon"],
            "delta": cert["delta"],
            "sigma": cert["sigma"],
            "sensitivity": cert["sensitivity"],
            "cumulative_epsilon": cert["cumulative_epsilon"],
        },
    }


def markdown(results: list[dict]) -> str:
    lines = [
        "# Recollection on digits (this machine, 2 CPU cores)",
        "",
        "| model | d | precompute (s) | × plain training | storage fp32 (MB) | per-request "
        "compute p50 | POST→certificate p50 | speedup (compute / service) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['architecture']} | {r['d']} | {r['precompute_seconds']:.1f} | "
            f"{r['precompute_ratio']:.0f}× | {r['storage_bytes_float32'] / 1e6:.2f} | "
            f"{r['unlearn_compute_seconds']['p50'] * 1e3:.2f} ms | "
            f"{r['post_to_certificate_seconds']['p50'] * 1e3:.0f} ms | "
            f"{r['speedup_compute_p50']:.0f}× / {r['speedup_service_p50']:.1f}× |"
        )
    lines += [
        "",
        "| model | removed | test acc released | noise-free | coupled retrain | "
        "plain retrain | rel. distance | MIA AUC noise-free / retrain | ε, σ, Δ |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for p in r["checkpoints"]:
            a, m, cert = p["test_accuracy"], p["mia_auc"], p["certificate"]
            lines.append(
                f"| {r['architecture']} | {p['fraction']:.0%} ({p['removed']}) | "
                f"{a['released']:.4f} | {a['noise_free']:.4f} | {a['coupled_retrain']:.4f} | "
                f"{a['plain_retrain']:.4f} | {p['distance_to_coupled_retrain']['relative']:.4f}"
                f" | {_f(m['noise_free'])} / {_f(m['coupled_retrain'])} | "
                f"ε={cert['epsilon']:.3g}, σ={cert['sigma']:.3g}, Δ={cert['sensitivity']:.3g} |"
            )
    lines += [
        "",
        'Seed 003 Table 1 ("Proposed" rows, GPU, as reported):',
        "",
        "| dataset | model | unlearning runtime | speedup | storage (GB) | Δ acc vs retrain |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {' | '.join(row)} |" for row in PAPER_TABLE1]
    return "\n".join(lines) + "\n"


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--archs", default="logreg,mlp")
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.archs.split(","):
            results.append(run_arch(name, args.epochs, Path(tmp)))
            print(f"{name}: done", flush=True)
    previous = RESULTS / "recollection.json"
    if previous.exists():  # keep the other architectures' results from earlier runs
        ran = {r["architecture"] for r in results}
        kept = [
            r
            for r in json.loads(previous.read_text()).get("results", [])
            if r["architecture"] not in ran
        ]
        results = kept + results
    path = write_result("recollection", {"results": results})
    (RESULTS / "recollection.md").write_text(markdown(results))
    print(f"wrote {path}")
    print(markdown(results))


if __name__ == "__main__":
    main()
