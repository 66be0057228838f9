"""Appended rows learned through the service: every model of the
dataset gets a `learned` version with its entry in the log; convex_head's stays within its
certified shift of the exact optimum on the rows it now holds, appended rows included; a later
deletion of an appended row is certified against that; the chain verifies and the tree holds
every entry; /metrics counts the learned versions."""

from __future__ import annotations

import io
import json
import time

import numpy as np
import torch
from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import Certificate
from tests.conftest import Api
from tests.service.test_convex_head import LAM, R
from tests.service.test_convex_head import noise_free_and_optimum as state_and_optimum
from tests.support.factories import forget


def table(ids: list[str], seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, len(ids))
    X = rng.normal(size=(len(ids), 4)).astype(np.float32)
    X[:, 0] += np.where(y == 1, 1.0, -1.0)
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=y, ids=np.array(ids), subjects=np.array([f"p-{i}" for i in ids]))
    return buffer.getvalue()


def learned(api: Api, dataset_id: int, append_id: int, timeout: float = 180.0) -> dict:
    """The append once every model's learning of it has ended: the long poll (`?wait=`)
    answers when the worker's commit wakes it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = f"/v1/datasets/{dataset_id}/appends/{append_id}"
        body = api.get(path, params={"wait": 30}).json()
        if body["learning"] and all(t["status"] in ("done", "failed") for t in body["learning"]):
            return body
    raise AssertionError(f"append {append_id} still learning: {body}")


def test_models_learn_an_append_and_later_certificates_count_its_rows(api: Api) -> None:
    upload = {"file": ("base.npz", table([f"a{i}" for i in range(400)], 0))}
    dataset = api.post("/v1/datasets", files=upload)
    assert dataset.status_code == 201, dataset.text
    dataset_id = dataset.json()["id"]
    models = {}
    for method in ({"name": "convex_head", "lam": LAM, "R": R}, {"name": "retrain"}):
        created = api.post(
            "/v1/models",
            json={"name": method["name"], "dataset_id": dataset_id,
                  "architecture": {"type": "logreg"}, "method": method},
        )  # fmt: skip
        assert created.status_code == 202, created.text
        ready = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
        assert ready["status"] == "ready", ready
        models[method["name"]] = ready["id"]

    before = learned_versions(api)
    new_ids = [f"b{i}" for i in range(120)]
    answer = api.post(
        f"/v1/datasets/{dataset_id}/samples", files={"file": ("more.npz", table(new_ids, 1))}
    )
    assert answer.status_code == 201, answer.text
    append = learned(api, dataset_id, answer.json()["id"])
    assert {t["model_id"] for t in append["learning"]} == set(models.values())
    assert all(t["status"] == "done" and t["version_id"] for t in append["learning"])
    added = append["learning"][0]["n_added"]
    assert 0 < added < 120  # the train rows among them; the rest joined the test split

    for name, model_id in models.items():
        versions = api.get(f"/v1/models/{model_id}/versions").json()
        last = versions[-1]
        assert last["kind"] == "learned" and last["number"] == 2, last
        assert last["metrics"]["n_added"] == added
        assert last["metrics"]["learned_from_appends"] == [append["id"]]
        # the append's test rows joined the split the version is scored on
        assert last["metrics"]["n_test"] == versions[-2]["metrics"]["n_test"] + 120 - added
        if name == "convex_head":  # the resident Hessian took the rows: no pass over them all
            assert last["metrics"]["hessian_passes"] == 0, last["metrics"]
        entries = api.get(
            "/v1/audit/certificates", params={"model": model_id}, role="auditor"
        ).json()["items"]
        # version 1 was superseded, not trained on erased data: the 410 says which
        gone = api.get(f"/v1/models/{model_id}/versions/1/weights")
        assert gone.status_code == 410, gone.text
        error = gone.json()["error"]
        assert error["code"] == "weights_superseded" and error["details"]["superseded_by"] == 2
        assert "erased" not in error["message"] and "appended rows" in error["message"]
        entry = entries[-1]
        assert entry["kind"] == "learned" and entry["request_id"] == 0
        assert entry["n_added"] == added and entry["to_version"] == 2
        assert entry["guarantee"] == ("rigorous" if name == "convex_head" else "exact")

    head = models["convex_head"]
    assert api.get(f"/v1/privacy/preview?model={head}").json()["learned_versions"] == 1
    theta, optimum, shift = noise_free_and_optimum(api, head)
    assert float(torch.linalg.norm(theta - optimum)) <= shift + 1e-10 / LAM

    train_new = [
        s["external_id"]
        for s in api.get(
            f"/v1/datasets/{dataset_id}/samples", params={"split": "train", "offset": 320}
        ).json()["items"]
        if s["external_id"].startswith("b")
    ]
    done = forget(api, dataset_id, train_new[:1])
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    assert cert["from_version"] == 2 and cert["to_version"] == 3
    assert cert["lineage"]["releases_since_reset"] == 2  # the learned release counts
    theta, optimum, shift = noise_free_and_optimum(api, head)
    assert float(torch.linalg.norm(theta - optimum)) <= shift + 1e-10 / LAM

    check = api.get("/v1/audit/verify", role="auditor").json()
    assert check["ok"], check
    with database(api.url).read() as session:
        entries = session.scalar(select(func.count()).select_from(Certificate))
    assert api.get("/v1/audit/head", role="auditor").json()["tree_size"] == entries
    after = learned_versions(api)  # earlier tests' counts of other methods stay
    learning = {"convex_head", "retrain"}
    assert {m: after.get(m, 0) - before.get(m, 0) for m in {*after, *learning}} == {
        m: 1.0 if m in learning else 0.0 for m in {*after, *learning}
    }


def learned_versions(api: Api) -> dict[str, float]:
    """lethe_versions_learned_total by method, as /metrics shows it (the counters live in the
    worker, which in thread mode is this test process: earlier tests' counts stay)."""
    found: dict[str, float] = {}
    for line in api.get("/metrics", role="admin").text.splitlines():
        if line.startswith("lethe_versions_learned_total{"):
            method = line.split('method="')[1].split('"')[0]
            found[method] = float(line.rsplit(" ", 1)[1])
    return found


def noise_free_and_optimum(api: Api, model_id: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The noise-free state and independent optimum (tests/service/test_convex_head.py) on the
    rows the model holds (appended ones included), with the newest release's certified shift s."""
    theta, optimum = state_and_optimum(api, model_id)
    with database(api.url).read() as session:
        cert = session.scalars(
            select(Certificate)
            .where(Certificate.model_id == model_id)
            .order_by(Certificate.seq.desc())
        ).first()
    return theta, optimum, float(json.loads(cert.restricted)["constants"]["s"]["value"])


def test_a_long_poll_answers_when_the_models_have_learned_the_append(api: Api) -> None:
    """`GET .../appends/{id}?wait=` answers once every model's learning has ended (the
    worker's commit wakes it), at once for an append no model learns, and refuses a wait past
    its cap."""
    upload = {"file": ("base.npz", table([f"w{i}" for i in range(200)], 2))}
    dataset_id = api.post("/v1/datasets", files=upload).json()["id"]
    alone = api.post(
        f"/v1/datasets/{dataset_id}/samples", files={"file": ("a.npz", table(["x0", "x1"], 3))}
    ).json()
    path = f"/v1/datasets/{dataset_id}/appends"
    quiet = api.get(f"{path}/{alone['id']}", params={"wait": 30}).json()
    assert quiet["status"] == "ready" and quiet["learning"] == []  # settled: nothing to learn
    spec = {"name": "r", "dataset_id": dataset_id, "architecture": {"type": "logreg"},
            "method": {"name": "retrain"}}  # fmt: skip
    model = api.wait(f"/v1/models/{api.post('/v1/models', json=spec).json()['id']}", ("ready",))
    answer = api.post(
        f"/v1/datasets/{dataset_id}/samples",
        files={"file": ("b.npz", table([f"y{i}" for i in range(30)], 4))},
    ).json()
    waited = api.get(f"{path}/{answer['id']}", params={"wait": 30}).json()
    assert [t["status"] for t in waited["learning"]] == ["done"], waited
    versions = api.get(f"/v1/models/{model['id']}/versions").json()
    assert versions[-1]["kind"] == "learned"
    assert api.get(f"{path}/{answer['id']}", params={"wait": 31}).status_code == 422
