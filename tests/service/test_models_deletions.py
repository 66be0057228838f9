"""The user story: train, download, delete with `retrain`, certificates, erasure, 410."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from safetensors.torch import load as st_load
from sqlalchemy import event, func, select
from sqlalchemy.engine import Engine

from app.core.db.session import database
from app.core.db.tables import Blob, DeletionRequest, ModelSample, ModelVersion, Sample
from app.core.settings import Settings
from app.main import create_app
from tests.conftest import SMALL_TRAINING, Api, make_keys, train_ids
from workers import deletions


def delete(api: Api, body: dict, **headers: str) -> dict:
    response = api.post("/v1/deletions", json=body, role="requester", headers=headers)
    assert response.status_code == 202, response.text
    return response.json()


def test_training_produces_version_one(api: Api, ready_model: dict) -> None:
    assert ready_model["status"] == "ready"
    v1 = ready_model["current_version"]
    assert v1["number"] == 1 and v1["kind"] == "trained" and v1["n_train"] == 1437
    assert 0.8 < v1["metrics"]["test_accuracy"] <= 1.0
    assert ready_model["progress"]["epoch"] == SMALL_TRAINING["epochs"]


def test_a_model_before_its_first_version_reports_its_size_without_counting(
    api: Api, digits: dict
) -> None:
    """A model that has not trained yet reports the rows it enrolled, read from the model:
    counting its `model_samples` on every read cost a core while ten million rows trained."""
    statements: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        statements.append(statement.lower())

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        response = api.post(
            "/v1/models",
            json={"name": "m", "dataset_id": digits["id"], "architecture": {"type": "logreg"}},
        )
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    assert response.status_code == 202, response.text
    assert response.json()["current_version"] is None and response.json()["n_train"] == 1437
    counted = [s for s in statements if "count(" in s and "model_samples" in s]
    assert not counted


def test_weights_download_with_etag(api: Api, ready_model: dict) -> None:
    response = api.get(f"/v1/models/{ready_model['id']}/weights", role="reader")
    assert response.status_code == 200
    assert response.headers["etag"] == f'"{hashlib.sha256(response.content).hexdigest()}"'
    tensors = st_load(response.content)
    assert tensors["1.weight"].shape == (10, 64)
    same = api.get(f"/v1/models/{ready_model['id']}/versions/1/weights", role="reader")
    assert same.content == response.content
    cached = api.client.get(
        f"/v1/models/{ready_model['id']}/weights",
        headers={**api.h("reader"), "If-None-Match": response.headers["etag"]},
    )
    assert cached.status_code == 304


def test_retrain_deletion_end_to_end(api: Api, digits: dict, ready_model: dict) -> None:
    ids = train_ids(api, digits["id"], 3)
    req = delete(api, {"dataset_id": digits["id"], "sample_ids": ids})
    assert req["status"] in ("queued", "running", "done")
    done = api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))
    assert done["status"] == "done", done
    assert done["models"][0]["version"] == 2 and done["models"][0]["n_removed"] == 3

    model = api.get(f"/v1/models/{ready_model['id']}").json()
    assert model["current_version"]["number"] == 2 and model["n_train"] == 1434
    assert model["current_version"]["kind"] == "retrained"

    certs = api.get("/v1/audit/certificates", role="auditor").json()["items"]
    assert len(certs) == 1
    cert = certs[0]
    assert (cert["epsilon"], cert["delta"], cert["guarantee"]) == (0.0, 0.0, "exact")
    assert cert["from_version"] == 1 and cert["to_version"] == 2 and cert["n_removed"] == 3
    assert cert["method"] == "retrain" and "3 samples" in cert["sentence"]
    opening = bytes.fromhex(req["opening"])  # only the POST's answer carries it
    ids_hmac = hmac.new(opening, "\n".join(sorted(ids)).encode(), hashlib.sha256).hexdigest()
    assert cert["removed_ids_commitment"] == ids_hmac
    assert "removed_ids_salt" not in cert and req["opening"] not in json.dumps(cert)
    assert done["opening"] is None  # reads never show it

    with database(api.url).write() as session:
        tokens = [api.runtime.keyring.token("sample", digits["id"], i) for i in ids]
        rows = session.execute(
            select(Sample.payload, Sample.key_id, Sample.status).where(
                Sample.dataset_id == digits["id"], Sample.external_id.in_(tokens)
            )
        ).all()
        assert len(rows) == 3
        assert all(r.payload is None and r.key_id is None and r.status == "erased" for r in rows)
        v1 = session.scalar(select(ModelVersion).where(ModelVersion.number == 1))
        assert v1.weights_key is None and v1.erased_at is not None
        assert session.scalar(select(func.count()).select_from(Blob)) == 2  # v2 weights + state

    gone = api.get(f"/v1/models/{ready_model['id']}/versions/1/weights", role="reader")
    assert gone.status_code == 410 and gone.json()["error"]["code"] == "weights_erased"
    versions = api.get(f"/v1/models/{ready_model['id']}/versions").json()
    assert [v["weights_available"] for v in versions] == [False, True]
    assert versions[0]["weights_sha256"]  # the hash stays for the audit

    verify = api.get("/v1/audit/verify", role="auditor").json()
    assert verify["ok"] and verify["checked"] == 1


def test_prefer_wait_answers_the_post_with_the_finished_request(
    api: Api, digits: dict, ready_model: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Prefer: wait=N` (RFC 7240): the POST answers once the request is finished, 200 with
    its certificates, receipts and the requester's opening, in one round trip; a preference
    it cannot read is ignored (202 at once), and a wait that runs out answers 202."""
    ids = train_ids(api, digits["id"], 3)
    body = {"dataset_id": digits["id"], "sample_ids": ids[:1]}
    waited = api.post("/v1/deletions", role="requester", json=body, headers={"Prefer": "wait=30"})
    assert waited.status_code == 200, waited.text
    assert waited.headers["preference-applied"] == "wait=30"
    done = waited.json()
    assert done["status"] == "done" and done["certificate_ids"] and done["receipts"]
    assert done["selector"]["sample_ids"] == ids[:1]  # the sender's own ids, not tokens
    assert done["opening"]  # the requester's copy, though the server's is now destroyed
    again = api.get(f"/v1/deletions/{done['id']}", role="requester").json()
    assert again["opening"] is None and again["certificate_ids"] == done["certificate_ids"]
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    opening = bytes.fromhex(done["opening"])
    ids_hmac = hmac.new(opening, ids[0].encode(), hashlib.sha256).hexdigest()
    assert cert["removed_ids_commitment"] == ids_hmac

    for prefer in ("wait=soon", "respond-async", "wait=-1"):
        body = {"dataset_id": digits["id"], "sample_ids": ids[1:2]}
        plain = api.post("/v1/deletions", role="requester", json=body, headers={"Prefer": prefer})
        assert plain.status_code == 202 and "preference-applied" not in plain.headers
        api.wait(f"/v1/deletions/{plain.json()['id']}", ("done",))

    real = deletions.compute_storing
    from app.api.deletions import get_deletion as real_get

    release = threading.Event()

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        release.wait(120)  # the update cannot finish before the answer came
        return real(*args, **kwargs)

    monkeypatch.setattr(deletions, "compute_storing", slow)
    body = {"dataset_id": digits["id"], "sample_ids": ids[2:3]}
    started = time.monotonic()
    late = api.post("/v1/deletions", role="requester", json=body, headers={"Prefer": "wait=1"})
    answered_unfinished = not release.is_set()
    release.set()
    assert answered_unfinished and late.status_code == 202, late.text
    assert late.json()["status"] in ("queued", "running") and late.json()["opening"]
    assert time.monotonic() - started >= 1.0  # it waited the second it was asked to
    api.wait(f"/v1/deletions/{late.json()['id']}", ("done",))

    from app.api import deletions as route

    def unreadable(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise RuntimeError("the database went away while the POST waited")

    monkeypatch.setattr(route, "get_deletion", unreadable)  # only the wait reads with it
    body = {"dataset_id": digits["id"], "sample_ids": train_ids(api, digits["id"], 1, offset=9)}
    lost = api.post("/v1/deletions", role="requester", json=body, headers={"Prefer": "wait=30"})
    assert lost.status_code == 202 and lost.json()["opening"]  # accepted and durable: not a 5xx
    monkeypatch.setattr(route, "get_deletion", real_get)
    api.wait(f"/v1/deletions/{lost.json()['id']}", ("done",))


def test_a_commit_is_refused_when_the_lease_the_version_or_a_task_moved(
    api: Api, digits: dict, ready_model: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit's one read of the model's lease, its version and the batch's tasks refuses
    (LeaseLost, nothing written) when another worker took the model, moved it on, or
    reclaimed a task; then, all restored, the same commit goes through."""
    from app.core.db.tables import DeletionTask, Model
    from workers import commit
    from workers.lease import LeaseLost

    real = commit.commit_update
    refusals: list[str] = []
    moves = [
        (Model, "lease_owner", "another-worker", "now leased by another-worker"),
        (Model, "current_version_id", None, "moved past version 1"),
        (DeletionTask, "lease_owner", "another-worker", "was reclaimed"),
    ]

    def refused_first(session, ctx, batch, outcome, stored, signer):  # type: ignore[no-untyped-def]
        for table, column, value, message in moves:
            row_id = batch.model_id if table is Model else batch.tasks[0].task_id
            with database(api.url).write() as other:
                row = other.get(table, row_id)
                kept = getattr(row, column)
                setattr(row, column, value)
            with pytest.raises(LeaseLost, match=message), database(api.url).write() as tried:
                real(tried, ctx, batch, outcome, stored, signer)
            refusals.append(message)
            with database(api.url).write() as other:
                setattr(other.get(table, row_id), column, kept)
        return real(session, ctx, batch, outcome, stored, signer)

    monkeypatch.setattr(commit, "commit_update", refused_first)
    done = delete(api, {"dataset_id": digits["id"], "sample_ids": train_ids(api, digits["id"], 1)})
    body = api.wait(f"/v1/deletions/{done['id']}", ("done", "failed"))
    assert body["status"] == "done", body
    assert refusals == [m for *_, m in moves]
    with database(api.url).read() as session:
        versions = session.scalars(
            select(ModelVersion.number).where(ModelVersion.model_id == ready_model["id"])
        ).all()
    assert sorted(versions) == [1, 2]  # the refused commits wrote nothing


def test_a_claim_is_one_statement_on_postgresql(
    api: Api, digits: dict, ready_model: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim marks the model's due tasks and their requests running and returns them: on
    PostgreSQL in one statement (data-modifying CTEs), on SQLite in three; either way the
    rows it returns are the ones it marked."""
    import sqlalchemy as sa

    from app.core.db.tables import DeletionTask
    from workers import claim

    real, seen = claim.claim_tasks, list[tuple[int, list[int], set[str], set[str]]]()

    def counted(session, model_id, limit, deadline):  # type: ignore[no-untyped-def]
        sent: list[str] = []

        def one(*args: object) -> None:
            sent.append(str(args[2]))

        engine = session.connection().engine
        sa.event.listen(engine, "before_cursor_execute", one)
        try:
            claimed = real(session, model_id, limit, deadline)
        finally:
            sa.event.remove(engine, "before_cursor_execute", one)
        ids = [t.task_id for t in claimed]
        tasks = session.scalars(select(DeletionTask).where(DeletionTask.id.in_(ids))).all()
        requests = session.scalars(
            select(DeletionRequest.status).where(
                DeletionRequest.id.in_([t.request_id for t in claimed])
            )
        ).all()
        seen.append((len(sent), ids, {t.status for t in tasks}, set(requests)))
        return claimed

    monkeypatch.setattr(claim, "claim_tasks", counted)
    done = delete(api, {"dataset_id": digits["id"], "sample_ids": train_ids(api, digits["id"], 1)})
    assert api.wait(f"/v1/deletions/{done['id']}", ("done", "failed"))["status"] == "done"
    statements, ids, task_statuses, request_statuses = next(s for s in seen if s[1])
    postgres = api.url.startswith("postgresql")
    assert statements == (1 if postgres else 3)
    assert task_statuses == {"running"} and request_statuses == {"running"}


def test_an_acceptance_writes_in_one_statement_on_postgresql(
    api: Api, digits: dict, ready_model: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A POST's commitment key, request, task and the sample's move to erasing are one
    statement on PostgreSQL (data-modifying CTEs), four on SQLite; either way the request
    is done with a certificate whose commitment opens with the opening it was given."""
    import threading

    import sqlalchemy as sa

    from app.core.services import acceptance as route

    real, seen = route.create_deletion, list[list[str]]()

    def counted(session, *args, **kwargs):  # type: ignore[no-untyped-def]
        sent: list[str] = []
        me = threading.get_ident()  # not the inline worker's statements

        def one(*event: object) -> None:
            if threading.get_ident() == me:
                sent.append(" ".join(str(event[2]).split()).upper())

        engine = session.get_bind()
        sa.event.listen(engine, "before_cursor_execute", one)
        try:
            return real(session, *args, **kwargs)
        finally:
            sa.event.remove(engine, "before_cursor_execute", one)
            seen.append(sent)

    monkeypatch.setattr(route, "create_deletion", counted)
    ids = train_ids(api, digits["id"], 1)
    sent = delete(api, {"dataset_id": digits["id"], "sample_ids": ids})
    done = api.wait(f"/v1/deletions/{sent['id']}", ("done", "failed"))
    assert done["status"] == "done" and done["certificate_ids"], done
    writes = [s for s in seen[0] if s.startswith(("INSERT", "UPDATE", "DELETE", "WITH"))]
    assert len(writes) == (1 if api.url.startswith("postgresql") else 4), seen[0]
    cert = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor").json()
    opening = bytes.fromhex(sent["opening"])
    expected = hmac.new(opening, ids[0].encode(), hashlib.sha256).hexdigest()
    assert cert["removed_ids_commitment"] == expected


def test_already_erased_reports_earlier_certificate(
    api: Api, digits: dict, ready_model: dict
) -> None:
    ids = train_ids(api, digits["id"], 2)
    first = api.wait(
        f"/v1/deletions/{delete(api, {'dataset_id': digits['id'], 'sample_ids': ids})['id']}",
        ("done",),
    )
    again = delete(api, {"dataset_id": digits["id"], "sample_ids": ids})
    assert again["status"] == "done" and again["models"] == []
    assert again["already_erased"] == [
        {"sample_id": i, "certificate_ids": first["certificate_ids"]} for i in ids
    ]
    versions = api.get(f"/v1/models/{ready_model['id']}/versions").json()
    assert len(versions) == 2  # no new version


def test_unknown_ids_are_404_and_nothing_is_queued(
    api: Api, digits: dict, ready_model: dict
) -> None:
    ids = train_ids(api, digits["id"], 1)
    response = api.post(
        "/v1/deletions",
        role="requester",
        json={
            "dataset_id": digits["id"],
            "sample_ids": [*ids, "nope-1", "nope-2"],
            "subject_ids": ["ghost"],
        },
    )
    assert response.status_code == 404
    details = response.json()["error"]["details"]
    assert details["unknown_sample_ids"] == ["nope-1", "nope-2"]
    assert details["unknown_subject_ids"] == ["ghost"]
    for body in ({"sample_ids": ids}, {"sample_ids": []}, {"subject_ids": ["ghost"]}):
        unknown = api.post("/v1/deletions", role="requester", json={"dataset_id": 999, **body})
        assert unknown.status_code == 404, body
        assert unknown.json()["error"]["code"] == "dataset_not_found", body
    with database(api.url).write() as session:
        assert session.scalar(select(func.count()).select_from(DeletionRequest)) == 0
        assert session.scalar(select(func.count()).where(Sample.status != "active")) == 0


def test_deletion_while_training_is_409(settings: Settings, tmp_path: Path) -> None:
    settings.pause_dir, settings.pause_at = tmp_path, ["training"]  # held until the test ends
    with TestClient(create_app(settings)) as client:
        api = Api(client, settings.resolved_database_url, make_keys(settings.resolved_database_url))
        digits = api.post("/v1/datasets", json={"builtin": "digits"}).json()
        model = api.post(
            "/v1/models",
            json={"name": "slow", "dataset_id": digits["id"], "training": SMALL_TRAINING},
        ).json()
        reached = tmp_path / f"training-{model['id']}.reached"
        deadline = time.monotonic() + 60
        while not reached.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.get(f"/v1/models/{model['id']}").json()["status"] == "training"
        ids = train_ids(api, digits["id"], 1)
        response = api.post(
            "/v1/deletions", role="requester", json={"dataset_id": digits["id"], "sample_ids": ids}
        )
        (tmp_path / f"training-{model['id']}.go").touch()
    assert response.status_code == 409
    assert response.json()["error"]["details"]["model_ids"] == [model["id"]]
    with database(api.url).read() as session:
        assert session.scalar(select(func.count()).select_from(DeletionRequest)) == 0


def test_idempotency_key_replays_first_response(api: Api, digits: dict, ready_model: dict) -> None:
    body = {"dataset_id": digits["id"], "sample_ids": train_ids(api, digits["id"], 1)}
    first = api.post(
        "/v1/deletions", role="requester", json=body, headers={"Idempotency-Key": "abc-123"}
    )
    second = api.post(
        "/v1/deletions", role="requester", json=body, headers={"Idempotency-Key": "abc-123"}
    )
    assert first.status_code == second.status_code == 202
    assert second.json()["id"] == first.json()["id"]
    assert second.headers.get("idempotent-replayed") == "true"
    other = api.post(
        "/v1/deletions",
        role="requester",
        headers={"Idempotency-Key": "abc-123"},
        json={**body, "sample_ids": train_ids(api, digits["id"], 1, offset=5)},
    )
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    api.wait(f"/v1/deletions/{first.json()['id']}", ("done",))
    with database(api.url).write() as session:
        assert session.scalar(select(func.count()).select_from(DeletionRequest)) == 1


BAD_DELETION_BODIES = [
    {"sample_ids": []},
    {"sample_ids": ["1"], "epsilon": -1},
    {"sample_ids": ["1"], "delta": 1.5},
    {"sample_ids": ["1"], "epsilon": 50.0},
    {"sample_ids": ["1"], "method": "magic"},
    {"sample_ids": ["1"], "unexpected": True},
]


def test_bad_deletion_bodies(api: Api, digits: dict, ready_model: dict) -> None:
    """Each body is a 422 with an error, against one trained model (a model trained for each
    body was 40 s of the suite's setups)."""
    for body in BAD_DELETION_BODIES:
        response = api.post(
            "/v1/deletions", role="requester", json={"dataset_id": digits["id"], **body}
        )
        assert response.status_code == 422, (body, response.text)
        assert "error" in response.json(), body


def test_nan_epsilon_is_422(api: Api, digits: dict) -> None:
    response = api.client.post(
        "/v1/deletions",
        headers={**api.h("requester"), "Content-Type": "application/json"},
        content=b'{"dataset_id": 1, "sample_ids": ["1"], "epsilon": NaN}',
    )
    assert response.status_code == 422


def test_subject_deletion_and_fan_out(api: Api) -> None:
    import io

    import numpy as np

    rng = np.random.default_rng(1)
    buf = io.BytesIO()
    np.savez(
        buf,
        X=rng.normal(size=(60, 4)),
        y=rng.integers(0, 2, 60),
        subjects=np.array([f"person{i % 6}" for i in range(60)]),
        split=np.array(["train"] * 50 + ["test"] * 10),
    )
    ds = api.post("/v1/datasets", files={"file": ("p.npz", buf.getvalue())}).json()
    model_ids = []
    for name in ("a", "b"):
        m = api.post(
            "/v1/models", json={"name": name, "dataset_id": ds["id"], "training": SMALL_TRAINING}
        ).json()
        model_ids.append(api.wait(f"/v1/models/{m['id']}", ("ready",))["id"])
    req = delete(api, {"dataset_id": ds["id"], "subject_ids": ["person3"]})
    done = api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))
    assert done["status"] == "done"
    assert sorted(m["model_id"] for m in done["models"]) == model_ids
    assert all(m["status"] == "done" and m["n_removed"] == 8 for m in done["models"])
    assert len(done["certificate_ids"]) == 2
    person3 = api.runtime.keyring.token("subject", ds["id"], "person3")
    with database(api.url).write() as session:
        held = session.scalar(
            select(func.count())
            .select_from(ModelSample)
            .join(Sample, Sample.id == ModelSample.sample_id)
            .where(Sample.subject_id == person3, ModelSample.removed_version_id.is_(None))
        )
        assert held == 0
        statuses = set(session.scalars(select(Sample.status).where(Sample.subject_id == person3)))
        assert statuses == {"erased"}  # train and test samples of the subject
    subject_certs = api.get(
        "/v1/audit/certificates", role="auditor", params={"subject": "person3"}
    ).json()["items"]
    assert len(subject_certs) == 2


def test_model_validation(api: Api, digits: dict) -> None:
    bad_arch = api.post(
        "/v1/models",
        json={
            "name": "x",
            "dataset_id": digits["id"],
            "architecture": {"type": "mlp", "batchnorm": True},
        },
    )
    assert bad_arch.status_code == 422
    assert api.post("/v1/models", json={"name": "x", "dataset_id": 42}).status_code == 404
    assert (
        api.post(
            "/v1/models", json={"name": "x", "dataset_id": digits["id"], "method": {"name": "nope"}}
        ).status_code
        == 422
    )
    assert (
        api.post(
            "/v1/models", json={"name": "x", "dataset_id": digits["id"], "training": {"epochs": 0}}
        ).status_code
        == 422
    )
    assert api.get("/v1/models/77").status_code == 404
    assert api.get("/v1/models/77/weights", role="reader").status_code == 404


def test_idempotency_keys_are_scoped_to_the_api_key(
    api: Api, digits: dict, ready_model: dict
) -> None:
    body = {"dataset_id": digits["id"], "sample_ids": train_ids(api, digits["id"], 1)}
    mine = api.post(
        "/v1/deletions", role="requester", json=body, headers={"Idempotency-Key": "same"}
    ).json()
    theirs = api.post("/v1/deletions", role="admin", json=body, headers={"Idempotency-Key": "same"})
    assert theirs.status_code == 202 and theirs.json()["id"] != mine["id"]
    assert theirs.headers.get("idempotent-replayed") is None
