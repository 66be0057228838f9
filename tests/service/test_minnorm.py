"""minnorm and minnorm_og: the projection is the minimum-norm retrain, the
stored Gram inverse depends on the retained samples only, the refusals, and the heuristic's
`none` certificate."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load as st_load
from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import Dataset, Model, ModelVersion
from maths.nets import build_net
from methods.minnorm import maths as mn
from methods.minnorm.compute import GRAM, ROWS
from methods.minnorm_og.compute import orthonormal_basis, project_step
from tests.conftest import Api, train_ids
from tests.support import factories
from tests.support.factories import forget
from workers.data import training_arrays

FEATURES = {"type": "random_features", "width": 2048, "activation": "relu", "seed": 3}


def create(api: Api, dataset_id: int, **spec: object) -> tuple[int, dict]:
    response = api.post("/v1/models", json={"name": "mn", "dataset_id": dataset_id, **spec})
    return response.status_code, response.json()


def minnorm_model(api: Api, dataset_id: int) -> dict:
    status, body = create(
        api,
        dataset_id,
        architecture=FEATURES,
        method={"name": "minnorm", "evaluate": False},
    )
    assert status == 202, body
    model = api.wait(f"/v1/models/{body['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return model


def theta_of(api: Api, model_id: int) -> torch.Tensor:
    """The released last layer [W, b] as downloaded (float64)."""
    response = api.get(f"/v1/models/{model_id}/weights", role="reader")
    assert response.status_code == 200
    state = st_load(response.content)
    assert state["2.weight"].dtype == torch.float64
    return torch.cat([state["2.weight"], state["2.bias"].unsqueeze(1)], dim=1)


def retained_features(api: Api, model_id: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Φ_r = [φ(x), 1] of the samples the model still holds, built independently of the
    service's solver from the architecture alone, with their labels and ids."""
    with database(api.url).read() as session:
        model = session.get(Model, model_id)
        dataset = session.get(Dataset, model.dataset_id)
        data = training_arrays(session, api.opened(), model_id, dataset)
    net = build_net(FEATURES, data.X[0].numel(), 10)
    with torch.no_grad():
        phi = mn.with_bias(net[1](net[0](data.X.double())))
    return phi, data.y, data.sample_ids


def stored_state(api: Api, model_id: int) -> dict[str, torch.Tensor]:
    with database(api.url).read() as session:
        model = session.get(Model, model_id)
        version = session.get(ModelVersion, model.current_version_id)
        return dict(factories.stored_state(api.runtime.blobs, session, version.state_key))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # maths, not storage: SQLite
def test_projection_is_the_min_norm_retrain_and_keeps_retained_outputs(
    api: Api, digits: dict
) -> None:
    """After deleting 1, 10 and 100 samples the released θ equals a from-scratch min-norm
    solve (SVD least squares) on the retained data to 1e-8 relative; the retained samples'
    outputs are unchanged; the stored Gram inverse is the retained samples' own."""
    model = minnorm_model(api, digits["id"])
    mid = model["id"]
    offset = 0
    for n in (1, 10, 100):
        before = theta_of(api, mid)
        done = forget(api, digits["id"], train_ids(api, digits["id"], n, offset))
        offset += n
        theta = theta_of(api, mid)
        phi, y, ids = retained_features(api, mid)
        fresh = torch.linalg.lstsq(
            phi, torch.nn.functional.one_hot(y, 10).double(), driver="gelsd"
        ).solution.T
        assert float((theta - fresh).norm() / fresh.norm()) <= 1e-8
        outputs_before, outputs_after = phi @ before.T, phi @ theta.T
        assert float((outputs_after - outputs_before).norm() / outputs_before.norm()) <= 1e-8
        assert float((theta - before).norm()) > 0  # something was removed
        cert = api.get(
            f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor"
        ).json()
        assert cert["guarantee"] == "exact" and cert["epsilon"] == 0 and cert["delta"] == 0
        assert cert["method"] == "minnorm" and "Theorem 4.1" in cert["sentence"]
        assert cert["constants"]["interpolation_residual"]["source"] == "measured"
        assert cert["constants"]["interpolation_residual"]["value"] <= 1e-9
        # What must be erased: the stored statistic is rebuilt from the retained rows alone.
        state = stored_state(api, mid)
        assert state[ROWS].tolist() == ids
        own = torch.linalg.inv(phi @ phi.T)
        assert float((state[GRAM] - own).norm() / own.norm()) <= 1e-6
    version = api.get(f"/v1/models/{mid}", role="auditor").json()["current_version"]
    assert version["metrics"]["route"].startswith("Gram-inverse downdate")
    public = api.get(f"/v1/models/{mid}", role="reader").json()["current_version"]
    assert "route" not in public["metrics"]  # which path ran is auditors'
    with database(api.url).read() as session:  # earlier states (and their inverses) purged
        live = session.scalar(
            select(func.count())
            .select_from(ModelVersion)
            .where(ModelVersion.model_id == mid, ModelVersion.state_key.is_not(None))
        )
    assert live == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # maths, not storage: SQLite
def test_sequential_requests_give_the_combined_model(api: Api) -> None:
    """Two identical datasets and models: three requests on one, one request for the same
    samples on the other, the same θ to 1e-9."""
    first = api.post("/v1/datasets", json={"builtin": "digits"}).json()
    second = api.post("/v1/datasets", json={"builtin": "digits"}).json()
    a, b = minnorm_model(api, first["id"]), minnorm_model(api, second["id"])
    ids = train_ids(api, first["id"], 30, 200)
    for chunk in (ids[:5], ids[5:17], ids[17:]):
        forget(api, first["id"], chunk)
    forget(api, second["id"], ids)
    ta, tb = theta_of(api, a["id"]), theta_of(api, b["id"])
    assert float((ta - tb).norm() / tb.norm()) <= 1e-9


def test_refusals_are_clear_and_write_nothing(api: Api, digits: dict) -> None:
    count = len(api.get("/v1/models").json())
    status, body = create(
        api, digits["id"], architecture={"type": "logreg"}, method={"name": "minnorm"}
    )
    assert status == 422 and body["error"]["code"] == "not_overparameterized", body
    assert "retrain" in body["error"]["message"] and "1437" in body["error"]["message"]
    status, body = create(
        api, digits["id"], architecture={"type": "mlp"}, method={"name": "minnorm"}
    )
    assert status == 422 and body["error"]["code"] == "minnorm_needs_linear_model", body
    status, body = create(
        api, digits["id"], architecture={"type": "mlp"}, method={"name": "minnorm_og"}
    )
    assert status == 422, body
    assert "allow_heuristic" in str(body["error"]), body
    assert len(api.get("/v1/models").json()) == count


def test_minnorm_og_is_a_declared_heuristic_with_an_evaluation(api: Api, digits: dict) -> None:
    """With allow_heuristic: a `none` certificate (ε, δ null, a sentence that claims nothing),
    the lineage untouched, and the shared evaluation attached to the version."""
    status, body = create(
        api,
        digits["id"],
        architecture={"type": "mlp", "hidden": [32]},
        training={"epochs": 5, "batch_size": 64, "learning_rate": 0.1, "seed": 0},
        method={"name": "minnorm_og", "epochs": 3, "descent_only_epochs": 1, "evaluate": True},
        privacy={"allow_heuristic": True},
    )
    assert status == 202, body
    model = api.wait(f"/v1/models/{body['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    done = forget(api, digits["id"], train_ids(api, digits["id"], 40, 0))
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    assert cert["guarantee"] == "none" and cert["method"] == "minnorm_og"
    assert cert["epsilon"] is None and cert["delta"] is None
    assert cert["cumulative_epsilon"] is None and cert["lineage_event"] is None
    assert cert["sentence"].startswith("No privacy claim is made")
    assert cert["constants"]["projections"]["value"] == 2  # epochs 0 and 1 of 3, one batch
    assert api.get("/v1/audit/verify", role="auditor").json()["ok"]
    preview = api.get("/v1/privacy/preview", params={"model": model["id"]}).json()
    assert preview["lineage"]["releases_since_reset"] == 0
    evaluation = api.get(f"/v1/models/{model['id']}", role="auditor").json()["current_version"][
        "metrics"
    ]["evaluation"]
    assert evaluation["reference"]["test_accuracy"] > 0.5
    assert 0.0 <= evaluation["mia_auc"] <= 1.0 and "original" in evaluation


def test_downdate_equals_the_inverse_of_the_retained_gram() -> None:
    gen = torch.Generator().manual_seed(0)
    phi = torch.randn(60, 200, generator=gen, dtype=torch.float64)
    inverse = mn.gram_inverse(phi, 1e-12)
    assert inverse is not None
    keep = torch.ones(60, dtype=torch.bool)
    keep[[3, 17, 41]] = False
    own = torch.linalg.inv(phi[keep] @ phi[keep].T)
    assert torch.allclose(mn.downdate(inverse, keep), own, rtol=1e-9, atol=1e-12)


def test_dependent_rows_fall_back_to_least_squares() -> None:
    """Duplicated rows: no Gram inverse is kept, and the fit is still the min-norm solution."""
    gen = torch.Generator().manual_seed(1)
    rows = torch.randn(20, 80, generator=gen, dtype=torch.float64)
    phi = torch.cat([rows, rows[:5]])
    targets = torch.cat([torch.eye(20, 4, dtype=torch.float64)] * 1 + [torch.eye(20, 4)[:5]])
    fit = mn.fit(phi, targets.double(), 1e-12)
    assert fit.gram_inverse is None and fit.rank == 20
    assert torch.allclose(fit.theta.T, torch.linalg.pinv(phi) @ targets.double(), atol=1e-10)


def test_projection_step_is_appendix_e() -> None:
    """θ − κ(θ − QQᵀθ) keeps θ's component in span(G) and shrinks the rest by (1 − κ)."""
    gen = torch.Generator().manual_seed(2)
    G = torch.randn(30, 4, generator=gen, dtype=torch.float64)
    G = torch.cat([G, G[:, :1] * 2], dim=1)  # dependent column: rank 4
    Q = orthonormal_basis(G, 1e-10)
    assert Q.shape == (30, 4)
    w = torch.randn(30, generator=gen, dtype=torch.float64)
    inside = Q @ (Q.T @ w)
    out = project_step(w, Q, 0.25)
    assert torch.allclose(Q @ (Q.T @ out), inside)
    assert torch.allclose(out - inside, 0.75 * (w - inside))


@pytest.mark.parametrize("width", [64])
def test_random_features_are_fixed_by_their_own_seed(width: int) -> None:
    spec = {**FEATURES, "width": width}
    torch.manual_seed(0)
    a = build_net(spec, 8, 3)
    torch.manual_seed(99)
    b = build_net(spec, 8, 3)
    assert torch.equal(a[1].weight, b[1].weight) and torch.equal(a[1].bias, b[1].bias)
    assert not any(p is a[1].weight for p in a.parameters())  # frozen: buffers, not trained
