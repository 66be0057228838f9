"""Issue 25 through the service (SQLite and PostgreSQL): training that diverges fails with a
reason; a model whose update and exact retrain cannot be computed is withdrawn and the data is
erased anyway; the certificate's commitment cannot be reversed by hashing candidate ids."""

from __future__ import annotations

from sqlalchemy import select, update

from app.db.session import database
from app.db.tables import Model, ModelVersion, Sample
from tests.conftest import SMALL_TRAINING, Api

DIVERGENT = {
    "epochs": 5,
    "batch_size": 32,
    "learning_rate": 8.58,
    "weight_decay": 0.41,
    "momentum": 0.9,
    "seed": 1,
}


def train_ids(api: Api, dataset_id: int, n: int, offset: int = 0) -> list[str]:
    page = api.get(
        f"/v1/datasets/{dataset_id}/samples",
        params={"split": "train", "limit": n, "offset": offset},
    ).json()
    return [s["external_id"] for s in page["items"]]


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
