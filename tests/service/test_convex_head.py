"""convex_head: the measured shift bounds the distance to the exact optimum, a
shift over β retrains, ε is the analytic Gaussian's, and inputs are clipped everywhere."""

from __future__ import annotations

import io
import json
import math

import dp_accounting
import numpy as np
import pytest
import torch
from scipy.optimize import brentq
from scipy.stats import norm
from sqlalchemy import select

from app.core.db.session import database
from app.core.db.tables import Dataset, Model, ModelVersion
from app.core.ledger.certificates import constant_commitment
from app.privacy.lineage import compose_events, gaussian_event
from maths import convex
from methods.convex_head.compute import to_theta
from tests.conftest import Api, train_ids
from tests.support.factories import certificate_of, forget, stored_state
from workers.data import training_arrays

LAM, R = 1e-2, 8.0
NO_FLOOR = {"max_relative_noise": None}  # no utility floor: every release is the method's


def convex_model(api: Api, dataset_id: int, **options: object) -> dict:
    created = api.post(
        "/v1/models",
        json={
            "name": "head",
            "dataset_id": dataset_id,
            "architecture": {"type": "logreg"},
            "method": {"name": "convex_head", "lam": LAM, "R": R, **options},
            "privacy": NO_FLOOR,  # the mechanism itself, however noisy its release
        },
    )
    assert created.status_code == 202, created.text
    model = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return model


def noise_free_and_optimum(api: Api, model_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The current noise-free state, and the exact optimum on the retained data solved from
    scratch to 1e-10 (independently of the service's solve)."""
    with database(api.url).read() as session:
        model = session.get(Model, model_id)
        version = session.get(ModelVersion, model.current_version_id)
        state = stored_state(api.runtime.blobs, session, version.state_key)
        dataset = session.get(Dataset, model.dataset_id)
        data = training_arrays(session, api.opened(), model_id, dataset)
    problem = convex.Problem.of(data.X, data.y, 2, R, LAM)
    optimum = convex.solve(problem, 1e-10, 5000)
    assert optimum.gradient_norm <= 1e-10
    return to_theta(state), optimum.theta


def current_metrics(api: Api, model_id: int) -> dict:
    with database(api.url).read() as session:
        model = session.get(Model, model_id)
        return dict(session.get(ModelVersion, model.current_version_id).metrics)


def test_measured_shift_bounds_the_distance_to_the_retrained_optimum(api: Api) -> None:
    """At 1, 10 and 100 removals the bound holds against an independent solve; the first
    removal finds the Hessian anchored after training, every removal downdates it."""
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    model = convex_model(api, ds["id"], beta=1.0)
    offset = 0
    for n in (1, 10, 100):
        done = forget(api, ds["id"], train_ids(api, ds["id"], n, offset))
        offset += n
        cert = certificate_of(api, done)
        assert cert["method"] == "convex_head" and cert["guarantee"] == "rigorous", cert
        s = cert["constants"]["s"]["value"]
        assert cert["constants"]["s"]["source"] == "measured"
        released, optimum = noise_free_and_optimum(api, model["id"])
        assert float(torch.linalg.norm(released - optimum)) <= s
        assert s <= 1.0 and cert["n_removed"] == n
        metrics = current_metrics(api, model["id"])
        assert metrics["hessian_passes"] == 0 and metrics["rows_loaded"] == 0, metrics
        assert metrics["n_train"] == 455 - offset


def test_a_shift_over_the_budget_releases_the_retrain_through_the_mechanism(api: Api) -> None:
    """s > β: the exact optimum (a cold solve) is released with the same noise and the same
    certificate; which branch ran is for auditors only."""
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    model = convex_model(api, ds["id"], beta=1e-14, newton_steps=1)
    done = forget(api, ds["id"], train_ids(api, ds["id"], 3))
    cert = certificate_of(api, done)
    assert cert["method"] == "convex_head" and cert["guarantee"] == "rigorous", cert
    assert cert["fallback_reason"] is None and cert["lineage_reset"] is False
    assert "exceeds the budget" in cert["branch"]  # the auditor's view
    receipt = json.loads(done["receipts"][0]["entry"])  # the requester's: a commitment only
    assert set(receipt["branch"]) == {"commitment", "disclosed_to"}
    version = api.get(f"/v1/models/{model['id']}/versions/2", role="reader").json()
    assert version["kind"] == "unlearned"
    released, optimum = noise_free_and_optimum(api, model["id"])
    assert float(torch.linalg.norm(released - optimum)) < 1e-6  # the exact solve


def analytic_gaussian_epsilon(z: float, delta: float) -> float:
    """Balle & Wang 2018, Theorem 8, solved for ε: an independent check of dp-accounting."""

    def excess(eps: float) -> float:
        return norm.cdf(1 / (2 * z) - eps * z) - math.exp(eps) * norm.cdf(-1 / (2 * z) - eps * z)

    return brentq(lambda e: excess(e) - delta, 1e-9, 100.0)


def test_certificate_epsilon_is_the_analytic_gaussian(api: Api) -> None:
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    convex_model(api, ds["id"], beta=0.5)
    cert = certificate_of(api, forget(api, ds["id"], train_ids(api, ds["id"], 2)))
    assert cert["guarantee"] == "rigorous"
    z = cert["sigma"] / cert["constants"]["beta"]["value"]
    assert cert["epsilon"] == pytest.approx(analytic_gaussian_epsilon(z, cert["delta"]), rel=1e-4)
    assert cert["epsilon"] == pytest.approx(1.0, rel=1e-3)  # the default target


def test_twenty_releases_compose_as_dp_accounting_says() -> None:
    z = 3.7306  # σ/β at (1, 1e-5)
    events = [gaussian_event(z, 1.0, 1.0, 1e-5) for _ in range(20)]
    ours = compose_events(events, 1e-5).epsilon
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(z), 20)
    assert ours == pytest.approx(accountant.get_epsilon(1e-5), rel=2e-3)


def test_inputs_are_clipped_in_training_and_unlearning(api: Api) -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 5))
    X[0] *= 10 * R / np.linalg.norm(X[0])  # ‖x‖ = 10·R
    y = (X[:, 0] + 0.3 * rng.normal(size=200) > 0).astype(int)
    buf = io.BytesIO()
    np.savez(buf, X=X, y=y, split=np.array(["train"] * 160 + ["test"] * 40))
    ds = api.post("/v1/datasets", files={"file": ("big.npz", buf.getvalue())}).json()
    model = convex_model(api, ds["id"], beta=1.0)
    clipped = X[:160].copy()
    clipped[0] *= math.sqrt(R * R - 1) / np.linalg.norm(clipped[0])
    problem = convex.Problem.of(torch.tensor(clipped), torch.tensor(y[:160]), 2, R, LAM)
    assert float(problem.Z.norm(dim=1).max()) <= R * (1 + 1e-12)
    expected = convex.solve(problem, 1e-10, 5000).theta
    trained, _ = noise_free_and_optimum(api, model["id"])
    assert float(torch.linalg.norm(trained - expected)) < 1e-6

    done = forget(api, ds["id"], ["1"])  # a sample next to the big one; then the big one
    assert certificate_of(api, done)["guarantee"] == "rigorous"
    done = forget(api, ds["id"], ["0"])
    cert = certificate_of(api, done)
    assert cert["guarantee"] == "rigorous", cert
    released, optimum = noise_free_and_optimum(api, model["id"])
    assert float(torch.linalg.norm(released - optimum)) <= cert["constants"]["s"]["value"]
    with database(api.url).read() as session:
        assert session.scalar(select(Model.architecture)).feature_norm == R


def test_convex_head_needs_a_logistic_head(api: Api) -> None:
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    response = api.post(
        "/v1/models",
        json={
            "name": "mlp",
            "dataset_id": ds["id"],
            "architecture": {"type": "mlp"},
            "method": {"name": "convex_head"},
        },
    )
    assert response.status_code == 422 and "logreg" in response.text


def test_preview_shows_sigma_noise_norm_and_recent_shifts(api: Api) -> None:
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    model = convex_model(api, ds["id"], beta=0.5)
    done = forget(api, ds["id"], train_ids(api, ds["id"], 1))
    view = api.get("/v1/privacy/preview", params={"model": model["id"]}).json()
    assert view["method"] == "convex_head" and view["feasible"] is True
    assert view["sigma"] == pytest.approx(0.5 * 3.7306, rel=1e-3)  # β · z(1, 1e-5)
    shift = view["shift"]
    assert shift["parameters"] == 2 * 31
    assert shift["expected_noise_norm"] == pytest.approx(view["sigma"] * math.sqrt(62))
    assert shift["weight_norm"] > 0
    s = certificate_of(api, done)["constants"]["s"]["value"]
    assert shift["recent"] == [
        {"request_id": done["id"], "n_removed": 1, "s": s, "s_over_beta": s / 0.5}
    ]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # a view question
def test_measured_values_of_the_removed_rows_go_to_auditors_only(api: Api) -> None:
    """s and the gradient norms are functions of the removed rows. The log's body
    (which receipts carry) holds a salted commitment and "≤ β"; auditors and admins get the
    values, which open the commitments; a requester's preview shows no recent s."""
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    model = convex_model(api, ds["id"], beta=0.5)
    done = forget(api, ds["id"], train_ids(api, ds["id"], 2))
    receipt = api.get(f"/v1/deletions/{done['id']}", role="requester").json()["receipts"][0]
    body = json.loads(receipt["entry"])
    for name in ("s", "gradient_norm", "slack", "gradient_norm_before"):
        assert body["constants"][name]["value"] is None
        assert body["constants"][name]["disclosed_to"] == "auditors and admins"
    assert body["constants"]["s"]["public"] == "≤ β = 0.5"
    assert body["constants"]["beta"]["value"] == 0.5  # declared constants stay public
    cert = certificate_of(api, done)  # the auditor's view
    s = cert["constants"]["s"]["value"]
    assert 0 < s <= 0.5 and f"{s:.4g}" not in receipt["entry"]
    for name in ("s", "gradient_norm", "slack", "gradient_norm_before"):
        entry = cert["constants"][name]
        assert constant_commitment(entry["salt"], entry["value"]) == entry["commitment"]
    assert cert["seq"] == body["seq"] == receipt["leaf_index"] + 1  # the same logged one
    as_requester = api.get("/v1/privacy/preview", params={"model": model["id"]}, role="requester")
    assert as_requester.json()["shift"]["recent"] is None
    as_auditor = api.get("/v1/privacy/preview", params={"model": model["id"]}, role="auditor")
    assert as_auditor.json()["shift"]["recent"][0]["s"] == s


def test_a_vanishing_lambda_is_refused_at_creation(api: Api) -> None:
    """λ = 5e-324 was accepted and training failed later."""
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    response = api.post(
        "/v1/models",
        json={
            "name": "tiny",
            "dataset_id": ds["id"],
            "architecture": {"type": "logreg"},
            "method": {"name": "convex_head", "lam": 5e-324},
        },
    )
    assert response.status_code == 422 and "lam" in response.text
