"""Certificates through the service: output perturbation, lineage composition, the
exact-retrain fallback when the budget would be exceeded, and the preview endpoint."""

from __future__ import annotations

import math

import pytest
from safetensors.torch import load as st_load

from app.privacy.gaussian import sigma_for
from app.privacy.lineage import compose
from tests.conftest import SMALL_TRAINING, Api

# the mechanism and the lineage, with no utility floor
POLICY = {
    "epsilon": 1.0,
    "delta": 1e-5,
    "lineage_epsilon": 1.8,
    "lineage_delta": 1e-5,
    "max_relative_noise": None,
}


@pytest.fixture
def noisy_model(api: Api) -> tuple[dict, dict]:
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    created = api.post(
        "/v1/models",
        json={
            "name": "op",
            "dataset_id": ds["id"],
            "training": SMALL_TRAINING,
            "method": {"name": "output_perturbation", "C0": 1.0},
            "privacy": POLICY,
        },
    )
    assert created.status_code == 202, created.text
    return ds, api.wait(f"/v1/models/{created.json()['id']}", ("ready",))


def delete_one(api: Api, ds: dict, offset: int) -> dict:
    sample = api.get(
        f"/v1/datasets/{ds['id']}/samples",
        params={"split": "train", "status": "active", "limit": 1},
    ).json()
    req = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": ds["id"], "sample_ids": [sample["items"][0]["external_id"]]},
    ).json()
    done = api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))
    assert done["status"] == "done", done
    return api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()


def test_tight_budget_makes_the_third_deletion_an_exact_retrain(
    api: Api, noisy_model: tuple
) -> None:
    ds, model = noisy_model
    z = sigma_for(2.0, 1.0, 1e-5) / 2.0
    preview = api.get("/v1/privacy/preview", params={"model": model["id"]}).json()
    assert preview["sigma"] == pytest.approx(2 * 3.7306, abs=1e-3)
    assert preview["sensitivity"] == 2.0 and preview["feasible"]
    assert preview["lineage"]["spent_epsilon"] == 0.0
    assert preview["lineage"]["epsilon_after_release"] == pytest.approx(1.0, abs=2e-3)
    assert preview["would_retrain_exactly"] is False

    certs = [delete_one(api, ds, i) for i in range(4)]
    kinds = [c["guarantee"] for c in certs]
    assert kinds == ["rigorous", "rigorous", "exact", "rigorous"]

    first, second, third, fourth = certs
    assert first["epsilon"] == pytest.approx(1.0, abs=1e-6) and first["delta"] == 1e-5
    assert first["sigma"] == pytest.approx(2 * 3.7306, abs=1e-3)
    assert first["sensitivity"] == 2.0
    assert first["cumulative_epsilon"] == pytest.approx(compose([z], 1e-5).epsilon, rel=1e-6)
    assert second["cumulative_epsilon"] == pytest.approx(compose([z, z], 1e-5).epsilon, rel=1e-6)
    assert 1.0 < second["cumulative_epsilon"] < 1.8 < compose([z, z, z], 1e-5).epsilon
    assert third["method"] == "retrain" and third["epsilon"] == 0.0
    assert third["cumulative_epsilon"] == 0.0 and third["lineage_reset"] is True
    assert "lineage" in third["fallback_reason"] and "budget" in third["sentence"]
    assert fourth["cumulative_epsilon"] == pytest.approx(first["cumulative_epsilon"])

    assert first["constants"]["C0"]["source"] == "declared"
    assert first["constants"]["clipped_norm"]["source"] == "measured"
    assert first["constants"]["clipped_norm"]["value"] <= 1.0 + 1e-6
    assert "dp-accounting" in first["accountant_versions"]
    assert "exact Gaussian composition" in second["accountant_versions"]["lineage"]
    assert "ε=1" in first["sentence"] and "without this sample" in first["sentence"]
    assert api.get("/v1/audit/verify", role="auditor").json()["ok"]

    after = api.get("/v1/privacy/preview", params={"model": model["id"]}).json()
    assert after["lineage"]["releases_since_reset"] == 1
    versions = api.get(f"/v1/models/{model['id']}/versions").json()
    assert [v["kind"] for v in versions] == [
        "trained",
        "unlearned",
        "unlearned",
        "retrained",
        "unlearned",
    ]


def test_released_weights_carry_the_noise(api: Api, noisy_model: tuple) -> None:
    ds, model = noisy_model
    cert = delete_one(api, ds, 0)
    weights = st_load(api.get(f"/v1/models/{model['id']}/weights", role="reader").content)
    d = sum(v.numel() for v in weights.values())
    norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in weights.values()))
    # release = base + N(0, σ²I) with ‖base‖ ≤ C0 = 1; Gaussian concentration:
    # P(|‖ξ‖ − E‖ξ‖| > 5σ) ≤ 7e-6 and E‖ξ‖ ∈ σ·[√(d−1), √d].
    sigma = cert["sigma"]
    assert sigma * (math.sqrt(d - 1) - 5) - 1.0 <= norm <= sigma * (math.sqrt(d) + 5) + 1.0


BAD_PREVIEW_TARGETS = [
    ({"epsilon": 0}, "invalid_privacy_target"),
    ({"epsilon": -1}, "invalid_privacy_target"),
    ({"delta": 2}, "invalid_privacy_target"),
    ({"delta": 0}, "invalid_privacy_target"),
    ({"epsilon": "nan"}, "invalid_privacy_target"),
    ({"epsilon": "inf"}, "invalid_privacy_target"),
    ({"epsilon": 5}, "target_looser_than_policy"),
]


def test_preview_rejects_bad_targets(api: Api, noisy_model: tuple) -> None:
    """Each target is a 422 naming why, against one model (one trained for each was 20 s of
    the suite's setups)."""
    _, model = noisy_model
    for params, code in BAD_PREVIEW_TARGETS:
        response = api.get("/v1/privacy/preview", params={"model": model["id"], **params})
        assert response.status_code == 422, (params, response.text)
        assert response.json()["error"]["code"] == code, (params, response.json())


def test_preview_unknown_model_and_bad_method_options(api: Api) -> None:
    assert api.get("/v1/privacy/preview", params={"model": 99}).status_code == 404
    ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
    bad = api.post(
        "/v1/models",
        json={
            "name": "x",
            "dataset_id": ds["id"],
            "method": {"name": "output_perturbation", "C0": -1},
        },
    )
    assert bad.status_code == 422
    bad_policy = api.post(
        "/v1/models",
        json={"name": "x", "dataset_id": ds["id"], "privacy": {"epsilon": 1, "delta": 1.5}},
    )
    assert bad_policy.status_code == 422


def test_the_method_table_for_a_new_model_plans_checks_and_costs_each_method(
    api: Api, ready_model: dict
) -> None:
    """GET /v1/privacy/methods (the model form's table): every method, refused with
    the API's own message where POST /v1/models would refuse it, planned at the target, with
    the share of a full retrain scaled by the dataset's measured training."""
    dataset = ready_model["dataset_id"]
    table = api.get(
        "/v1/privacy/methods", params={"dataset": dataset, "epsilon": 0.5, "delta": 1e-6}
    )
    assert table.status_code == 200, table.text
    body = table.json()
    rows = {r["method"]: r for r in body["methods"]}
    assert body["target"] == {"epsilon": 0.5, "delta": 1e-6} and body["n_train"] > 0
    assert body["full_retrain_seconds"] > 0
    assert f"model {ready_model['id']}" in body["full_retrain_basis"]
    # the planned σ is the preview's: a model of that method at the same target plans it so
    # output_perturbation's noise dwarfs its C0 ball: under the default floor it is refused
    op = rows["output_perturbation"]
    assert not op["available"] and op["guarantee"] == "rigorous" and op["sigma"] > 0
    floor = op["below_floor"]
    assert floor["expected_noise_norm"] > floor["max_relative_noise"] * floor["scale"]
    assert floor["scale"] == 1.0 and "max_relative_noise" in op["refusal"]
    sharded = rows["sharded_retrain"]
    assert sharded["available"] and 0 < sharded["fraction_of_full_retrain"] < 1
    assert sharded["expected_compute_seconds"] == pytest.approx(
        body["full_retrain_seconds"] * sharded["fraction_of_full_retrain"]
    )
    assert rows["retrain"]["fraction_of_full_retrain"] == 1.0
    # refused as the API refuses: a heuristic without allow_heuristic, a topic model on images
    heuristic = rows["minnorm_og"]
    assert not heuristic["available"] and "allow_heuristic" in heuristic["refusal"]
    refused = api.post(
        "/v1/models",
        json={"name": "x", "dataset_id": dataset, "method": {"name": "minnorm_og"}},
    )
    assert refused.status_code == 422
    assert not rows["anchor_topics"]["available"]
    # a row is what creating it gives: refused with the same figures, and without the floor
    # (the admin says so) created, its preview planning the same σ
    spec = {
        "name": "chosen",
        "dataset_id": dataset,
        "training": SMALL_TRAINING,
        "method": {"name": "output_perturbation"},
        "privacy": {"epsilon": 0.5, "delta": 1e-6},
    }
    below = api.post("/v1/models", json=spec)
    assert below.status_code == 422, below.text
    assert below.json()["error"]["code"] == "below_utility_floor"
    assert below.json()["error"]["details"] == floor
    spec["privacy"]["max_relative_noise"] = None
    created = api.post("/v1/models", json=spec)
    assert created.status_code == 202, created.text
    model = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    preview = api.get("/v1/privacy/preview", params={"model": model["id"]}).json()
    assert preview["sigma"] == pytest.approx(op["sigma"])
    assert (
        api.get(
            "/v1/privacy/methods", params={"dataset": dataset, "architecture": "nope"}
        ).status_code
        == 422
    )
    assert api.get("/v1/privacy/methods", params={"dataset": 99999}).status_code == 404
