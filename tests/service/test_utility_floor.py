"""A noisy release that would be noise rather than a model is not published: past the policy's
`max_relative_noise` of the model's last noise-free norm, the exact retrain is released, for a
reason made of public values only (workers/updates.py `utility_floor`)."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import Api, train_ids
from tests.service.test_convex_head import LAM, R, current_metrics
from workers.updates import RESIDENT_READY

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def head(api: Api, dataset_id: int, floor: float | None) -> int:
    spec = {"name": "head", "dataset_id": dataset_id, "architecture": {"type": "logreg"},
            "method": {"name": "convex_head", "lam": LAM, "R": R},
            "privacy": {"max_relative_noise": floor}}  # fmt: skip
    created = api.post("/v1/models", json=spec)
    assert created.status_code == 202, created.text
    model = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return model["id"]


def erased_at(api: Api, dataset_id: int, ids: list[str], epsilon: float) -> dict[int, dict]:
    """The rows erased at a target of `epsilon`; each model's certificate for it."""
    body = {"dataset_id": dataset_id, "sample_ids": ids, "epsilon": epsilon}
    asked = api.post("/v1/deletions", role="requester", json=body)
    assert asked.status_code == 202, asked.text
    done = api.wait(f"/v1/deletions/{asked.json()['id']}", ("done", "failed"))
    assert done["status"] == "done", done
    path = "/v1/audit/certificates/{}"
    return {
        m["model_id"]: api.get(path.format(m["certificate_id"]), role="auditor").json()
        for m in done["models"]
    }


def test_a_release_that_would_be_noise_is_the_exact_retrain_instead(api: Api, digits: dict) -> None:
    guarded, unguarded = head(api, digits["id"], 0.5), head(api, digits["id"], None)
    ids = train_ids(api, digits["id"], 4)
    preview = api.get("/v1/privacy/preview", params={"model": guarded, "epsilon": 1e-4}).json()
    floor = preview["utility_floor"]  # the preview says so before any request
    assert floor["below"] and preview["would_retrain_exactly"], preview
    assert floor["expected_noise_norm"] > floor["max_relative_noise"] * floor["scale"]
    assert floor["sigma"] == pytest.approx(preview["sigma"])
    loose = api.get("/v1/privacy/preview", params={"model": guarded}).json()
    assert not loose["utility_floor"]["below"] and not loose["would_retrain_exactly"]
    unset = api.get("/v1/privacy/preview", params={"model": unguarded, "epsilon": 1e-4}).json()
    assert unset["utility_floor"] is None
    reasons = []
    for one in ids[:2]:  # two worlds, two different rows removed: the same public decision
        certs = erased_at(api, digits["id"], [one], 1e-4)
        cert = certs[guarded]
        assert cert["guarantee"] == "exact" and cert["method"] == "retrain", cert
        assert "max_relative_noise" in cert["fallback_reason"]
        reasons.append(cert["fallback_reason"])
    assert reasons[0] == reasons[1]  # σ, the count of parameters and a public norm: no row
    served = api.get(f"/v1/models/{guarded}").json()["current_version"]
    assert served["kind"] == "retrained"
    assert served["metrics"]["test_accuracy"] > 0.9  # a model, not noise

    noisy = api.get(f"/v1/models/{unguarded}").json()["current_version"]  # no floor: noise
    assert noisy["kind"] == "unlearned" and noisy["metrics"]["test_accuracy"] < 0.5
    assert certs[unguarded]["method"] == "convex_head"
    assert certs[unguarded]["guarantee"] == "rigorous"


def test_a_release_within_the_floor_is_the_method_s(api: Api, digits: dict) -> None:
    model = head(api, digits["id"], 1000.0)  # a floor that a release at ε = 1 stays under
    cert = erased_at(api, digits["id"], train_ids(api, digits["id"], 1), 1.0)[model]
    assert cert["method"] == "convex_head" and cert["fallback_reason"] is None
    assert api.get(f"/v1/models/{model}").json()["current_version"]["kind"] == "unlearned"


def test_the_update_after_an_exact_retrain_finds_its_anchor_ready(
    api: Api, digits: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """An exact retrain comes with the anchor its Newton polish made (no Hessian pass after
    it for the next request to wait on), so the next update reads no row and makes no
    Hessian pass (no cliff)."""
    caplog.set_level(logging.INFO, "lethe")
    model = head(api, digits["id"], 1.0)
    for epsilon, below in ((1e-4, True), (1.0, False)):
        preview = api.get("/v1/privacy/preview", params={"model": model, "epsilon": epsilon})
        assert preview.json()["utility_floor"]["below"] is below, preview.json()
    first, second = train_ids(api, digits["id"], 2)
    assert erased_at(api, digits["id"], [first], 1e-4)[model]["method"] == "retrain"
    cert = erased_at(api, digits["id"], [second], 1.0)[model]
    assert cert["method"] == "convex_head" and cert["fallback_reason"] is None, cert
    metrics = current_metrics(api, model)
    assert metrics["hessian_passes"] == 0 and metrics["rows_loaded"] == 0, metrics
    ready = [r.getMessage() for r in caplog.records if RESIDENT_READY in r.getMessage()]
    assert ready == [f"model {model}: {RESIDENT_READY} (made by the retrain)"], ready
