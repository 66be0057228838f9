"""Issue 25 through the service (SQLite and PostgreSQL): training that diverges fails with a
reason; a model whose update and exact retrain cannot be computed is withdrawn and the data is
erased anyway; the certificate's commitment cannot be reversed by hashing candidate ids."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
import torch
from safetensors.torch import load as st_load
from sqlalchemy import select, update

from app.core.db.session import database
from app.core.db.tables import DeletionRequest, Model, ModelVersion, Sample
from app.core.ledger.certificates import commitment_holds
from tests.conftest import SMALL_TRAINING, Api, train_ids

# The database adds nothing to these checks: SQLite only, to keep the suite's time.
SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

DIVERGENT = {
    "epochs": 5,
    "batch_size": 32,
    "learning_rate": 8.58,
    "weight_decay": 0.41,
    "momentum": 0.9,
    "seed": 1,
}


def model(api: Api, dataset_id: int, training: dict, **method: object) -> dict:
    response = api.post(
        "/v1/models",
        json={
            "name": "m",
            "dataset_id": dataset_id,
            "architecture": {"type": "mlp", "hidden": [32]},
            "training": training,
            **({"method": method} if method else {}),
        },
    )
    assert response.status_code == 202, response.text
    return api.wait(f"/v1/models/{response.json()['id']}", ("ready", "failed"))


def test_divergent_training_fails_with_a_reason(api: Api, digits: dict) -> None:
    trained = model(api, digits["id"], DIVERGENT)
    assert trained["status"] == "failed"
    assert "training diverged" in trained["error"] and "non-finite" in trained["error"]
    assert trained["current_version"] is None


def test_a_model_that_cannot_forget_is_withdrawn_and_the_data_erased(
    api: Api, digits: dict
) -> None:
    ready = model(api, digits["id"], SMALL_TRAINING)
    assert ready["status"] == "ready"
    with database(api.url).write() as session:  # as if its settings had been divergent
        session.execute(update(Model).where(Model.id == ready["id"]).values(training=DIVERGENT))
    ids = train_ids(api, digits["id"], 2)
    req = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": digits["id"], "sample_ids": ids}
    ).json()
    done = api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))
    assert done["status"] == "done", done
    assert done["certificate_ids"] == []
    assert "withdrawn" in (done["models"][0]["error"] or "")
    withdrawn = api.get(f"/v1/models/{ready['id']}").json()
    assert withdrawn["status"] == "failed" and withdrawn["error"].startswith("withdrawn: ")
    assert "diverged" in withdrawn["error"]
    assert api.get(f"/v1/models/{ready['id']}/versions/1/weights").status_code == 410
    current = api.get(f"/v1/models/{ready['id']}/weights")
    assert current.status_code == 410 and current.json()["error"]["code"] == "model_withdrawn"
    samples = api.get(
        f"/v1/datasets/{digits['id']}/samples", params={"status": "erased", "limit": 10}
    ).json()["items"]
    assert len(samples) == 2
    with database(api.url).read() as session:
        assert session.scalars(select(ModelVersion.weights_key)).all() == [None]
        statuses = session.scalars(select(Sample.status).where(Sample.key_id.is_(None))).all()
        assert statuses == ["erased", "erased"]
    # a later request of this dataset is not held up by the withdrawn model
    later = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": digits["id"], "sample_ids": train_ids(api, digits["id"], 1, 5)},
    ).json()
    assert later["status"] == "done"  # no live model holds it: erased at once
    assert api.wait(f"/v1/deletions/{later['id']}", ("done", "failed"))["status"] == "done"


@SQLITE_ONLY
def test_a_certificate_commitment_cannot_be_reversed_without_the_opening(
    api: Api, digits: dict
) -> None:
    ready = model(api, digits["id"], SMALL_TRAINING)
    assert ready["status"] == "ready"
    candidates = train_ids(api, digits["id"], 200)
    gone = candidates[17:18]
    req = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": digits["id"], "sample_ids": gone}
    ).json()
    opening = req["opening"]
    assert isinstance(opening, str) and len(opening) == 64
    done = api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))
    assert done["status"] == "done" and done["opening"] is None
    (cert_id,) = done["certificate_ids"]
    cert = api.get(f"/v1/audit/certificates/{cert_id}", role="auditor").json()
    published = json.dumps(cert) + json.dumps(done)
    assert opening not in published
    commitment = cert["removed_ids_commitment"]
    # An attacker with the certificate (auditor, export, receipt) hashes every candidate id
    # with every public field it could take for a salt or key: nothing matches.
    keys = [str(v).encode() for v in cert.values() if isinstance(v, str | int)] + [b""]
    for key in keys:
        for c in candidates:
            assert hashlib.sha256(key + b"\n" + c.encode()).hexdigest() != commitment
            assert hmac.new(key, c.encode(), hashlib.sha256).hexdigest() != commitment
    # the requester, who holds the opening, can check that its id is the one removed
    assert commitment_holds(opening, gone, commitment)
    assert not commitment_holds(opening, candidates[16:17], commitment)
    # and the server no longer keeps it: its data key is destroyed
    with database(api.url).read() as session:
        row = session.get(DeletionRequest, req["id"])
        assert row is not None and row.commitment_key_id is None


@SQLITE_ONLY
def test_a_version_is_never_scored_on_test_rows_its_request_erases(api: Api, digits: dict) -> None:
    ready = model(api, digits["id"], SMALL_TRAINING)
    v1 = api.get(f"/v1/models/{ready['id']}/versions/1").json()
    test_rows = api.get(
        f"/v1/datasets/{digits['id']}/samples", params={"split": "test", "limit": 2}
    ).json()["items"]
    ids = train_ids(api, digits["id"], 1) + [s["external_id"] for s in test_rows]
    req = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": digits["id"], "sample_ids": ids}
    ).json()
    assert api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))["status"] == "done"
    v2 = api.get(f"/v1/models/{ready['id']}/versions/2").json()
    assert v2["metrics"]["n_test"] == v1["metrics"]["n_test"] - 2


@SQLITE_ONLY
def test_the_same_subjectless_data_registered_twice_gives_the_same_ensemble(api: Api) -> None:
    """Issue 25 item 2 through the service: the SISA assignment is keyed on what the data says
    (here the rows' numbers in the file), not on database ids, so a second registration of the
    same data gives a bit-identical ensemble, before and after deleting the same rows."""
    first, second = (
        api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json() for _ in range(2)
    )
    method = {"name": "sharded_retrain", "shards": 4, "slices": 2}
    released = []
    for ds in (first, second):
        response = api.post(
            "/v1/models",
            json={
                "name": "sisa",
                "dataset_id": ds["id"],
                "architecture": {"type": "logreg"},
                "training": SMALL_TRAINING,
                "method": method,
            },
        )
        assert response.status_code == 202, response.text
        ready = api.wait(f"/v1/models/{response.json()['id']}", ("ready", "failed"))
        assert ready["status"] == "ready", ready
        released.append(ready)
    assert first["id"] != second["id"]
    a, b = (tensors(api, m["id"]) for m in released)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for ds in (first, second):
        gone = train_ids(api, ds["id"], 3, 10)
        req = api.post(
            "/v1/deletions", role="requester", json={"dataset_id": ds["id"], "sample_ids": gone}
        ).json()
        assert api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))["status"] == "done"
    a, b = (tensors(api, m["id"]) for m in released)
    assert all(torch.equal(a[k], b[k]) for k in a)


def tensors(api: Api, model_id: int) -> dict[str, torch.Tensor]:
    response = api.get(f"/v1/models/{model_id}/weights", role="reader")
    assert response.status_code == 200
    return dict(st_load(response.content))
