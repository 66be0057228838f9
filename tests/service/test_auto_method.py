"""`"method": "auto"` chooses a model's method at creation, the first of a fixed order that
serves the model, meets its policy and clears the utility floor (methods/auto.py); the model
and every certificate say what was chosen and why."""

from __future__ import annotations

import pytest

from tests.conftest import SMALL_TRAINING, Api, train_ids
from tests.support.factories import forget

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def created(api: Api, dataset_id: int, architecture: dict, **auto: object) -> dict:
    spec = {"name": "auto", "dataset_id": dataset_id, "architecture": architecture,
            "training": SMALL_TRAINING, "method": {"name": "auto", **auto}}  # fmt: skip
    answer = api.post("/v1/models", json=spec)
    assert answer.status_code == 202, answer.text
    return answer.json()


def test_auto_chooses_by_the_model_and_says_why(api: Api, digits: dict) -> None:
    ds = digits["id"]
    head = created(api, ds, {"type": "logreg"})  # a linear head: a certified Newton step
    assert head["method"]["name"] == "convex_head", head["method"]
    assert head["architecture"]["feature_norm"] == head["method"]["R"]  # convex_head's clip
    assert head["method"]["chosen_by"].startswith("auto: a Newton step")
    assert "minnorm (" in head["method"]["chosen_by"]  # passed over, with its reason

    wide = created(api, ds, {"type": "random_features", "width": 4096})  # overparameterized
    assert wide["method"]["name"] == "minnorm", wide["method"]

    net = {"type": "mlp", "hidden": [32]}
    small = created(api, ds, net)  # cheap to retrain whole: retrained whole
    assert small["method"]["name"] == "retrain", small["method"]
    assert "max_retrain_work" in small["method"]["chosen_by"]
    big = created(api, ds, net, max_retrain_work=1e3)  # past the work it will spend: sharded
    assert big["method"]["name"] == "sharded_retrain", big["method"]
    assert big["method"]["shards"] == 4

    for model in (head, wide, small, big):
        ready = api.wait(f"/v1/models/{model['id']}", ("ready", "failed"))
        assert ready["status"] == "ready", ready
    done = forget(api, ds, train_ids(api, ds, 1))
    certificates = [
        api.get(f"/v1/audit/certificates/{m['certificate_id']}", role="auditor").json()
        for m in done["models"]
    ]
    by_model = {c["model_id"]: c for c in certificates}
    assert by_model[head["id"]]["method_chosen_by"] == head["method"]["chosen_by"]


def test_auto_is_refused_where_it_cannot_choose(api: Api, digits: dict) -> None:
    for method, code in [
        ({"name": "auto", "max_retrain_work": -1}, "invalid_request"),
        ({"name": "auto", "shards": 4}, "invalid_request"),  # auto's options only
        ({"name": "retrain", "chosen_by": "me"}, "invalid_request"),  # Lethe's to set
    ]:
        spec = {"name": "x", "dataset_id": digits["id"], "method": method}
        answer = api.post("/v1/models", json=spec)
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["code"] == code, answer.text
