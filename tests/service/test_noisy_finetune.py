"""Seed 002 noisy fine-tuning and imported models, through the service: the certificate's
(ε, δ) is the accountant's for the run, the noisy phase has the norm its noise implies, and a
model trained elsewhere gets a rigorous certificate."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import save as st_save

from methods.noisy_finetune.accountant import gc_certificate, mc_delta
from tests.conftest import SMALL_TRAINING, Api

GC = {
    "name": "noisy_finetune",
    "variant": "gradient_clipping",
    "C0": 0.1,
    "C1": 1.0,
    "lam": 0.0,
    "gamma": 0.01,
    "sigma": 1.0,
}


def model_with(api: Api, ds: dict, method: dict, **extra: object) -> dict:
    created = api.post(
        "/v1/models",
        json={
            "name": "nf",
            "dataset_id": ds["id"],
            "training": SMALL_TRAINING,
            "method": method,
            **extra,
        },
    )
    assert created.status_code == 202, created.text
    return api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))


def delete_one(api: Api, ds: dict) -> tuple[dict, dict]:
    sample = api.get(
        f"/v1/datasets/{ds['id']}/samples",
        params={"split": "train", "status": "active", "limit": 1},
    ).json()
    req = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": ds["id"], "sample_ids": [sample["items"][0]["external_id"]]},
    ).json()
    done = api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"), timeout=300)
    assert done["status"] == "done", done
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor")
    return cert.json(), done


@pytest.fixture
def digits(api: Api) -> dict:
    return api.post("/v1/datasets", json={"builtin": "digits"}).json()


def test_gradient_clipping_certificate_and_noise_norm(api: Api, digits: dict) -> None:
    model = model_with(api, digits, GC)
    cert, done = delete_one(api, digits)
    assert cert["guarantee"] == "rigorous" and cert["method"] == "noisy_finetune"
    T = int(cert["constants"]["T"]["value"])
    eps, delta, slope = gc_certificate(0.1, 1.0, 0.0, 0.01, 1.0, T, 1e-5)
    assert cert["epsilon"] == pytest.approx(eps, rel=1e-9) and eps <= 1.0
    assert cert["delta"] == 1e-5 and cert["lineage_event"]["slope"] == pytest.approx(slope)
    assert "Theorem A.9" in cert["sentence"]
    version = api.get(f"/v1/models/{model['id']}/versions/{done['models'][0]['version']}")
    norm = version.json()["metrics"]["noisy_phase_norm"]
    d = 64 * 10 + 10
    drift = 0.1 + 0.01 * 1.0 * T  # ‖x_0‖ ≤ C0, each step moves ≤ γ·C1
    # Σ ξ_t ~ N(0, Tσ²I): E‖·‖ ∈ σ√T·[√(d−1), √d], and Gaussian concentration gives
    # P(|‖·‖ − E‖·‖| > 5σ√T) ≤ 2e^(−12.5) ≈ 7e-6 (a wrong σ or a missing step falls outside).
    scale = 1.0 * math.sqrt(T)
    assert scale * (math.sqrt(d - 1) - 5) - drift <= norm <= scale * (math.sqrt(d) + 5) + drift


def test_model_clipping_certificate(api: Api, digits: dict) -> None:
    method = {
        "name": "noisy_finetune",
        "variant": "model_clipping",
        "C0": 1.0,
        "C2": 0.5,
        "sigma": 0.5,
        "gamma": 0.05,
        "finetune_epochs": 2,
    }
    model_with(api, digits, method)
    cert, _ = delete_one(api, digits)
    T = int(cert["constants"]["T"]["value"])
    assert cert["epsilon"] == 1.0
    assert cert["delta"] == pytest.approx(mc_delta(1.0, T, 0.5, 0.5, C0=1.0))
    assert cert["delta"] <= 1e-5
    assert mc_delta(1.0, T - 1, 0.5, 0.5, C0=1.0) > 1e-5  # T is the smallest that works
    assert cert["lineage_event"]["kind"] == "approx" and "Theorem 4.2" in cert["sentence"]


def test_infeasible_noise_retrains_exactly(api: Api, digits: dict) -> None:
    model_with(api, digits, {**GC, "sigma": 0.05})
    cert, _ = delete_one(api, digits)
    assert cert["guarantee"] == "exact" and "noise floor" in cert["fallback_reason"]


def weights_for(shapes: dict[str, tuple[int, ...]]) -> bytes:
    gen = torch.Generator().manual_seed(0)
    return st_save({k: 0.1 * torch.randn(s, generator=gen) for k, s in shapes.items()})


def import_form(ds: dict, method: dict, data: bytes, arch: str = '{"type": "logreg"}'):
    import json

    return {
        "files": {"weights": ("m.safetensors", data)},
        "data": {
            "name": "imported",
            "dataset_id": str(ds["id"]),
            "architecture": arch,
            "method": json.dumps(method),
            "training": json.dumps(SMALL_TRAINING),
        },
    }


def test_imported_model_gets_a_rigorous_certificate(api: Api) -> None:
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    data = weights_for({"1.weight": (2, 30), "1.bias": (2,)})
    created = api.post("/v1/models/import", **import_form(ds, GC, data))
    assert created.status_code == 202, created.text
    model = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    assert model["current_version"]["kind"] == "imported"
    assert model["current_version"]["metrics"]["test_accuracy"] is not None
    cert, _ = delete_one(api, ds)
    assert cert["guarantee"] == "rigorous" and cert["epsilon"] <= 1.0


@pytest.mark.parametrize("case", ["shape", "garbage", "recollection", "missing", "json"])
def test_bad_imports_are_422(api: Api, case: str) -> None:
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    good = weights_for({"1.weight": (2, 30), "1.bias": (2,)})
    form = {
        "shape": import_form(ds, GC, weights_for({"1.weight": (3, 30), "1.bias": (3,)})),
        "garbage": import_form(ds, GC, b"\x00" * 64),
        "recollection": import_form(ds, {"name": "recollection"}, good),
        "json": import_form(ds, GC, good, arch="{not json"),
    }.get(case)
    if case == "missing":
        form = import_form(ds, GC, good)
        form.pop("files")
    response = api.post("/v1/models/import", **form)
    assert response.status_code == 422, response.text
    expected = {
        "shape": "weights_do_not_match_architecture",
        "garbage": "malformed_weights",
        "recollection": "method_needs_training",
        "missing": "missing_file",
        "json": "invalid_request",
    }[case]
    assert response.json()["error"]["code"] == expected
    assert api.get("/v1/models").json() == []
