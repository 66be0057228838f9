"""Seed 003 recollection: the maths against the coupled retrain, and the method end to end
through the service on SQLite and PostgreSQL."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from sklearn.datasets import make_classification
from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import Model, ModelVersion, Sample, SampleStatistic
from maths.nets import FlatModel, build_net
from methods.recollection.maths import train_recollection
from tests.conftest import Api
from tests.support.factories import forget, stored_state

CONFIG = {"epochs": 10, "batch_size": 64, "learning_rate": 0.05, "weight_decay": 1e-3, "seed": 0}
LOGREG = {"type": "logreg"}


@pytest.fixture(scope="module")
def small_problem() -> tuple[torch.Tensor, torch.Tensor]:
    X, y = make_classification(
        n_samples=300,
        n_features=20,
        n_informative=6,
        n_classes=3,
        n_clusters_per_class=1,
        random_state=0,
    )
    return torch.tensor(X, dtype=torch.float32), torch.tensor(y)


def as_flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    names = FlatModel(build_net(LOGREG, 20, 3)).names
    return torch.cat([state[n].reshape(-1) for n in names])


@pytest.mark.parametrize("m,bound", [(1, 0.1), (10, 0.1), (50, 0.25)])
def test_update_tracks_the_coupled_retrain(small_problem: tuple, m: int, bound: float) -> None:
    X, y = small_problem
    run = train_recollection(LOGREG, CONFIG, 10.0, 0.995, X, y, 3, rho_checks=2)
    w = as_flat(run.state)
    removed = torch.arange(m) * 5
    exclude = torch.zeros(300, dtype=torch.bool)
    exclude[removed] = True
    retrain = as_flat(
        train_recollection(
            LOGREG, CONFIG, 10.0, 0.995, X, y, 3, record=False, exclude=exclude
        ).state
    )
    update = w + run.vectors[removed].sum(0)
    moved = float((retrain - w).norm())
    assert moved > 0
    assert float((update - retrain).norm()) <= bound * moved  # doing nothing scores 1.0


def test_replay_without_exclusions_is_the_original_training(small_problem: tuple) -> None:
    X, y = small_problem
    recorded = train_recollection(LOGREG, CONFIG, 10.0, 0.995, X, y, 3, rho_checks=1)
    replay = train_recollection(LOGREG, CONFIG, 10.0, 0.995, X, y, 3, record=False)
    assert torch.equal(as_flat(recorded.state), as_flat(replay.state))
    assert 0.0 < recorded.rho < 1.0  # L2-regularised logistic regression with a small step


def test_vmapped_hvp_matches_the_dense_hessian(small_problem: tuple) -> None:
    """One step from zero vectors: after the first two steps a_i is checkable by hand."""
    X, y = small_problem
    cfg = {**CONFIG, "epochs": 1, "batch_size": 300}  # full batch: one step per epoch
    two = {**cfg, "epochs": 2}
    run = train_recollection(LOGREG, two, 1e6, 1.0, X, y, 3, rho_checks=1)
    net = build_net(LOGREG, 20, 3)
    model = FlatModel(net)
    first = train_recollection(LOGREG, cfg, 1e6, 1.0, X, y, 3, record=False)
    w1 = as_flat(first.state)

    def loss(w: torch.Tensor) -> torch.Tensor:
        ce = torch.nn.functional.cross_entropy(model.logits(w, X), y)
        return ce + 0.5 * CONFIG["weight_decay"] * (w @ w)

    hessian = torch.autograd.functional.hessian(loss, w1)
    w0 = torch.cat(
        [p.detach().reshape(-1) for p in FlatModel(_seeded(CONFIG["seed"])).net.parameters()]
    )
    eta = CONFIG["learning_rate"]

    def grad_i(w: torch.Tensor, i: int) -> torch.Tensor:
        w = w.clone().requires_grad_(True)
        ce = torch.nn.functional.cross_entropy(model.logits(w, X[i : i + 1]), y[i : i + 1])
        return torch.autograd.grad(ce, w)[0]

    i = 7
    a1 = eta / 300 * grad_i(w0, i)
    expected = a1 - eta * hessian @ a1 + eta / 300 * grad_i(w1, i)
    assert torch.allclose(run.vectors[i], expected, atol=1e-6, rtol=1e-4)


def _seeded(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_net(LOGREG, 20, 3)


# ---- through the service -------------------------------------------------------------------


def synthetic(api: Api) -> dict:
    body = {"builtin": "synthetic", "n_samples": 375, "n_features": 20, "n_classes": 3}
    response = api.post("/v1/datasets", json=body)
    assert response.status_code == 201, response.text
    return response.json()


def recollection_model(api: Api, dataset_id: int, **options: object) -> dict:
    created = api.post(
        "/v1/models",
        json={
            "name": "rec",
            "dataset_id": dataset_id,
            "architecture": LOGREG,
            "training": CONFIG,
            "method": {"name": "recollection", **options},
        },
    )
    assert created.status_code == 202, created.text
    model = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return model


def noise_free_state(api: Api, model_id: int) -> dict[str, torch.Tensor]:
    with database(api.url).write() as session:
        model = session.get(Model, model_id)
        version = session.get(ModelVersion, model.current_version_id)
        return stored_state(api.runtime.blobs, session, version.state_key)


def train_external_ids(api: Api, dataset_id: int, n: int) -> list[str]:
    page = api.get(
        f"/v1/datasets/{dataset_id}/samples", params={"split": "train", "limit": n}
    ).json()
    return [s["external_id"] for s in page["items"]]


def test_additivity_one_request_or_two(api: Api) -> None:
    first, second = synthetic(api), synthetic(api)
    a = recollection_model(api, first["id"], max_relative_noise=None)
    b = recollection_model(api, second["id"], max_relative_noise=None)
    u, v = train_external_ids(api, first["id"], 2)
    forget(api, first["id"], [u, v])
    forget(api, second["id"], [u])
    forget(api, second["id"], [v])
    sa, sb = noise_free_state(api, a["id"]), noise_free_state(api, b["id"])
    for key in sa:
        assert torch.allclose(sa[key], sb[key], atol=1e-6)
    versions = api.get(f"/v1/models/{b['id']}/versions").json()
    assert [v["kind"] for v in versions] == ["trained", "unlearned", "unlearned"]


def test_vectors_are_consumed_and_certificate_is_conditional(api: Api) -> None:
    ds = synthetic(api)
    model = recollection_model(api, ds["id"], max_relative_noise=None, evaluate=True)
    record = model["current_version"]["metrics"]["record"]
    assert record["rows"] == 300 and record["d"] == 63
    ids = train_external_ids(api, ds["id"], 3)
    ring = api.runtime.keyring
    with database(api.url).write() as session:
        sample_ids = session.scalars(
            select(Sample.id).where(
                Sample.dataset_id == ds["id"],
                Sample.external_id.in_([ring.token("sample", ds["id"], i) for i in ids]),
            )
        ).all()
        assert (
            session.scalar(select(func.count()).where(SampleStatistic.sample_id.in_(sample_ids)))
            == 3
        )
    done = forget(api, ds["id"], ids)
    with database(api.url).write() as session:
        assert (
            session.scalar(select(func.count()).where(SampleStatistic.sample_id.in_(sample_ids)))
            == 0
        )
        assert session.scalar(select(func.count()).select_from(SampleStatistic)) == 297
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    assert cert["guarantee"] == "conditional" and cert["method"] == "recollection"
    assert cert["constants"]["rho"]["source"] == "measured"
    assert cert["constants"]["C"]["source"] == "declared"
    assert "Theorem 2" in cert["sentence"] and cert["sensitivity"] > 0 and cert["sigma"] > 0
    evaluation = api.get(f"/v1/models/{model['id']}/versions/2").json()["metrics"]["evaluation"]
    assert evaluation["reference"]["relative_distance_noise_free"] < 0.1
    again = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": ds["id"], "sample_ids": ids}
    ).json()
    assert again["already_erased"][0]["certificate_ids"] == done["certificate_ids"]


def test_vacuous_bound_falls_back_to_exact_retrain(api: Api) -> None:
    ds = synthetic(api)
    model = recollection_model(api, ds["id"])  # default guard: max_relative_noise = 1
    done = forget(api, ds["id"], train_external_ids(api, ds["id"], 1))
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    assert cert["guarantee"] == "exact" and "weights' norm" in cert["fallback_reason"]
    with database(api.url).write() as session:  # the retrain recorded fresh vectors
        assert (
            session.scalar(select(func.count()).where(SampleStatistic.model_id == model["id"]))
            == 299
        )
    versions = api.get(f"/v1/models/{model['id']}/versions").json()
    assert versions[-1]["metrics"]["record"]["rows"] == 299


def test_float16_storage_and_subject_vectors(api: Api) -> None:
    X, y = make_classification(
        n_samples=200, n_features=10, n_informative=5, n_classes=2, random_state=1
    )
    buf = io.BytesIO()
    np.savez(
        buf,
        X=X,
        y=y,
        subjects=np.array([f"p{i // 4}" for i in range(200)]),
        split=np.array(["train"] * 160 + ["test"] * 40),
    )
    ds = api.post("/v1/datasets", files={"file": ("s.npz", buf.getvalue())}).json()
    model = recollection_model(
        api, ds["id"], storage_dtype="float16", per_subject=True, max_relative_noise=None
    )
    record = model["current_version"]["metrics"]["record"]
    assert record["rows"] == 40 and record["storage_dtype"] == "float16"  # 160 samples, 40 people
    whole = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": ds["id"], "subject_ids": ["p3"]}
    ).json()
    done = api.wait(f"/v1/deletions/{whole['id']}", ("done", "failed"))
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    assert cert["guarantee"] == "conditional" and cert["n_removed"] == 4
    partial = forget(api, ds["id"], ["20"])  # one of p5's four samples
    cert = api.get(f"/v1/audit/certificates/{partial['certificate_ids'][0]}", role="auditor").json()
    # whether the row's subject is retained depends on the rows: the coupled
    # retrain goes out through the same noise, and only auditors read why
    assert cert["guarantee"] == "conditional" and "part of its subject" in cert["branch"]
    kinds = [v["kind"] for v in api.get(f"/v1/models/{model['id']}/versions").json()]
    assert kinds == ["trained", "unlearned", "unlearned"]


def test_nondeterministic_layers_are_refused(api: Api) -> None:
    ds = synthetic(api)
    for method in ("recollection", "retrain"):
        response = api.post(
            "/v1/models",
            json={
                "name": "x",
                "dataset_id": ds["id"],
                "architecture": {"type": "mlp", "hidden": [8], "dropout": 0.5},
                "method": {"name": method},
            },
        )
        assert response.status_code == 422
        detail = response.json()["error"]["details"][0]
        assert detail["type"] == "nondeterministic_architecture"
        assert "deterministic layers only" in detail["msg"] and "dropout" in detail["msg"]


def test_preview_for_a_data_dependent_method(api: Api) -> None:
    ds = synthetic(api)
    model = recollection_model(api, ds["id"])
    preview = api.get("/v1/privacy/preview", params={"model": model["id"]}).json()
    assert preview["feasible"] is None and "depends on the removed samples" in preview["reason"]
    assert preview["would_retrain_exactly"] is False
