"""Issue 26 through the service: nothing recovers an erased person from the database alone
(fingerprints and Idempotency-Keys), receipts carry no other request, and erased is answered
as unknown to whoever did not erase it."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy import LargeBinary, String, Text, select

from app.core.db.migrate import alembic_config
from app.core.db.session import database, engine_for
from app.core.db.tables import Base
from app.core.ledger.certificates import RESTRICTED, canonical_json, constant_commitment
from app.core.schemas import DeletionCreate
from app.core.services.deletions import request_fingerprint
from app.core.states import Guarantee
from tests.conftest import Api, train_ids


def every_stored_text(url: str) -> str:
    """Every text, JSON and binary column of every table, as one string to search."""
    parts: list[str] = []
    with database(url).read() as session:
        for table in Base.metadata.sorted_tables:
            for column in table.columns:
                if isinstance(column.type, String | Text | LargeBinary) or "JSON" in str(
                    column.type
                ):
                    for (value,) in session.execute(select(column)):
                        if value is not None:
                            parts.append(value.hex() if isinstance(value, bytes) else str(value))
    return "\n".join(parts)


def old_fingerprints(dataset_id: int, candidates: list[str]) -> set[str]:
    """What the fingerprint used to be for one-id requests: sha256 of the raw body."""
    out = set()
    for c in candidates:
        for field in ("sample_ids", "subject_ids"):
            body = DeletionCreate.model_validate({"dataset_id": dataset_id, field: [c]})
            out.add(
                hashlib.sha256(json.dumps(body.model_dump(), sort_keys=True).encode()).hexdigest()
            )
    return out


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_no_hash_of_an_erased_id_or_its_request_is_stored(
    api: Api, digits: dict, ready_model: dict
) -> None:
    candidates = train_ids(api, digits["id"], 300)
    gone = candidates[42]
    req = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": digits["id"], "sample_ids": [gone]},
        headers={"Idempotency-Key": f"forget-{gone}"},
    ).json()
    assert api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))["status"] == "done"
    stored = every_stored_text(api.url)
    hashes = old_fingerprints(digits["id"], candidates)
    assert not [h for h in hashes if h in stored], "a stored digest gives the erased id back"
    assert f"forget-{gone}" not in stored  # the Idempotency-Key is kept only as a token
    for c in candidates:  # nor a plain or salted-free sha256 of any candidate id
        assert hashlib.sha256(c.encode()).hexdigest() not in stored
    replay = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": digits["id"], "sample_ids": [gone]},
        headers={"Idempotency-Key": f"forget-{gone}"},
    )
    assert replay.headers.get("Idempotent-Replayed") == "true"
    assert replay.json()["id"] == req["id"]


def test_migration_0008_rewrites_stored_fingerprints_over_tokens(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0007")
    selector = {"sample_ids": ["tok-a", "tok-b"], "subject_ids": []}
    raw = hashlib.sha256(b'{"dataset_id": 1, "sample_ids": ["17", "18"]}').hexdigest()
    with engine_for(url).begin() as conn:  # (the schema of 0007: no ORM on its tables)
        conn.execute(
            sa.text(
                "INSERT INTO datasets (id, name, kind, source, feature_shape, n_classes, "
                "n_samples, created_at) VALUES (1, 'd', 'tabular', 't', '[2]', 2, 0, '2026-01-01')"
            )
        )  # a dataset for the request to belong to
        conn.execute(
            sa.text(
                "INSERT INTO deletion_requests (id, dataset_id, idempotency_key, fingerprint, "
                "selector, sample_ids, already_erased, status, created_at, updated_at) VALUES "
                "(1, 1, '3:forget-17', :fp, :sel, '[]', '[]', 'done', '2026-01-01', '2026-01-01')"
            ),
            {"fp": raw, "sel": json.dumps(selector)},
        )
    command.upgrade(alembic_config(url), "head")
    with engine_for(url).connect() as conn:
        key, fp = conn.execute(
            sa.text("SELECT idempotency_key, fingerprint FROM deletion_requests")
        ).one()
    engine_for(url).dispose()
    assert key is None
    assert fp == request_fingerprint(1, ["tok-a", "tok-b"], [], None, None, None) != raw


def test_a_receipt_carries_no_other_request() -> None:
    """Issue 26 item 4: the logged body (a requester's receipt) commits to the coalesced
    requests and the batch size; the values go to auditors only, and they open."""
    from app.core.specs import PrivacyPolicy
    from methods.compute import CertificateFields, PrivacyTarget, Release
    from workers.certify import CertificateContext, certificate_fields
    from workers.values import Released

    cert = CertificateFields(Guarantee.exact, 0.0, 0.0, 0.0, 0.0, "none", "Exact.")
    release = Release({}, {}, cert, None, [])
    ctx = CertificateContext(7, 1, 1, 2, "0" * 64, 1, 5, [5, 6, 7], "c" * 64)
    fields = certificate_fields(
        Released(release, "retrain", None), PrivacyPolicy(), PrivacyTarget(1.0, 1e-5), ctx
    )
    restricted = fields.pop(RESTRICTED)
    body = canonical_json(fields)
    assert "[5,6,7]" not in body and '"n_removed_in_update":5' not in body
    for name, value in (("coalesced_requests", [5, 6, 7]), ("n_removed_in_update", 5)):
        opened = restricted["fields"][name]
        assert opened["value"] == value
        assert constant_commitment(opened["salt"], value) == fields[name]["commitment"]
    assert fields["request_id"] == 7 and fields["n_removed"] == 1  # its own request stays


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_export_opens_every_restricted_value(
    api: Api, digits: dict, ready_model: dict, tmp_path: Path
) -> None:
    ids = train_ids(api, digits["id"], 2)
    req = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": digits["id"], "sample_ids": ids}
    ).json()
    done = api.get(f"/v1/deletions/{req['id']}", role="requester", params={"wait": 30}).json()
    entry = json.loads(done["receipts"][0]["entry"])
    assert set(entry["coalesced_requests"]) == {"disclosed_to", "commitment"}
    audited = api.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}", role="auditor")
    assert audited.json()["coalesced_requests"] == [req["id"]]
    export = tmp_path / "audit.jsonl"
    export.write_text(api.get("/v1/audit/export", role="auditor").text)
    script = Path(__file__).resolve().parents[2] / "scripts" / "verify_audit.py"
    ok = subprocess.run([sys.executable, str(script), str(export)], capture_output=True, text=True)
    assert ok.returncode == 0 and "chain holds" in ok.stdout, ok.stderr
    line = json.loads(export.read_text().splitlines()[0])
    line["restricted"]["fields"]["n_removed_in_update"]["value"] = 99  # a lie about the batch
    export.write_text(json.dumps(line) + "\n")
    bad = subprocess.run([sys.executable, str(script), str(export)], capture_output=True, text=True)
    assert bad.returncode == 1 and "does not open" in bad.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_erased_and_never_existed_look_alike_to_whoever_did_not_erase_it(
    api: Api, ready_model: dict
) -> None:
    dataset_id = ready_model["dataset_id"]
    gone, other = train_ids(api, dataset_id, 2)
    req = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": dataset_id, "sample_ids": [gone]}
    ).json()
    assert api.wait(f"/v1/deletions/{req['id']}", ("done", "failed"))["status"] == "done"
    second = api.post("/v1/keys", json={"role": "requester"}).json()["key"]
    headers = {"Authorization": f"Bearer {second}"}

    def ask(sample: str, headers: dict[str, str] = headers) -> tuple[int, dict]:
        body = {"dataset_id": dataset_id, "sample_ids": [sample]}
        response = api.client.post("/v1/deletions", json=body, headers=headers)
        return response.status_code, response.json()

    erased_status, erased = ask(gone)
    unknown_status, unknown = ask("no-such-id")
    assert erased_status == unknown_status == 404
    assert erased["error"]["code"] == unknown["error"]["code"] == "sample_not_found"
    assert erased["error"]["details"]["unknown_sample_ids"] == [gone]
    assert erased["error"]["message"] == unknown["error"]["message"]
    # whoever erased it, and admins, still hear "already erased", with the certificate
    mine_status, mine = ask(gone, api.h("requester"))
    assert mine_status == 202 and mine["already_erased"][0]["sample_id"] == gone
    assert ask(gone, api.h("admin"))[1]["already_erased"][0]["certificate_ids"]
    assert ask(other)[0] == 202  # a live sample is still forgotten for anyone
    # listings: a reader sees no erased row (its position would say which); an admin does
    as_reader = api.get(
        f"/v1/datasets/{dataset_id}/samples", role="reader", params={"limit": 1000}
    ).json()
    assert all(s["status"] != "erased" for s in as_reader["items"])
    erased_rows = api.get(
        f"/v1/datasets/{dataset_id}/samples", params={"status": "erased", "limit": 1000}
    ).json()
    assert erased_rows["total"] >= 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_erased_subject_and_an_unknown_one_look_alike(api: Api) -> None:
    import io

    import numpy as np

    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    subjects = np.array([f"person-{i % 10}" for i in range(120)])
    np.savez(buf, X=rng.normal(size=(120, 4)), y=rng.integers(0, 2, 120), subjects=subjects)
    ds = api.post("/v1/datasets", files={"file": ("p.npz", buf.getvalue())}).json()
    body = {"dataset_id": ds["id"], "subject_ids": ["person-3"]}
    req = api.post("/v1/deletions", role="requester", json=body).json()
    assert req["status"] == "done"  # no model holds them: erased at once
    second = api.post("/v1/keys", json={"role": "requester"}).json()["key"]
    headers = {"Authorization": f"Bearer {second}"}
    erased = api.client.post("/v1/deletions", json=body, headers=headers)
    unknown = api.client.post(
        "/v1/deletions", json={**body, "subject_ids": ["person-99"]}, headers=headers
    )
    assert erased.status_code == unknown.status_code == 404
    assert erased.json()["error"]["details"]["unknown_subject_ids"] == ["person-3"]
    assert api.post("/v1/deletions", role="requester", json=body).status_code == 202


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_dashboard_page_is_served_only_at_ui_with_its_policy(api: Api) -> None:
    page = api.client.get("/ui")
    assert (
        page.status_code == 200 and "unsafe-inline" not in page.headers["content-security-policy"]
    )
    assert api.client.get("/ui/static/index.html").status_code == 404
    script = api.client.get("/ui/static/app.js")
    assert script.status_code == 200 and script.headers["x-content-type-options"] == "nosniff"


def test_the_issues_two_oversize_models_are_estimated_over_12_gib() -> None:
    from app.core.services import memory
    from app.core.specs import TrainingConfig, architecture_of
    from methods import method_of

    topics = memory.estimate(
        architecture_of({"type": "topic_model", "topics": 500}),
        TrainingConfig(),
        method_of({"name": "anchor_topics"}),
        4_999,
        20_001,
        1,
    )
    sharded = memory.estimate(
        architecture_of({"type": "mlp", "hidden": [4096] * 4}),
        TrainingConfig(),
        method_of({"name": "sharded_retrain", "shards": 64, "slices": 4}),
        1_437,
        64,
        10,
    )
    assert topics["bytes"] > 12 * 2**30 and sharded["bytes"] > 12 * 2**30
    small = memory.estimate(
        architecture_of({"type": "mlp", "hidden": [64, 64]}),
        TrainingConfig(),
        method_of({"name": "retrain"}),
        1_437,
        64,
        10,
    )
    assert small["bytes"] < 64 * 2**20


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_model_over_the_memory_budget_is_refused_at_creation(api: Api, digits: dict) -> None:
    response = api.post(
        "/v1/models",
        json={
            "name": "huge",
            "dataset_id": digits["id"],
            "architecture": {"type": "mlp", "hidden": [4096] * 4},
            "method": {"name": "sharded_retrain", "shards": 64, "slices": 4},
        },
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "model_too_large"
    assert error["details"]["estimated_bytes"] > error["details"]["limit_bytes"]
    assert api.get("/v1/models").json() == []  # nothing was written


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_shutdown_stops_training_cleanly_and_the_next_start_resumes_it(settings) -> None:
    """the app's shutdown (what SIGTERM runs) stops a training job between epochs;
    the model goes back to `queued`, not `failed`, and the next start trains it again."""
    import time

    from fastapi.testclient import TestClient

    from app.core.db.tables import Model
    from app.main import create_app
    from tests.conftest import make_keys

    app = create_app(settings)
    with TestClient(app) as client:
        keys = make_keys(settings.resolved_database_url)
        auth = {"Authorization": f"Bearer {keys['admin']}"}
        ds = client.post("/v1/datasets", json={"builtin": "digits"}, headers=auth).json()
        created = client.post(
            "/v1/models",
            json={
                "name": "long",
                "dataset_id": ds["id"],
                "architecture": {"type": "mlp", "hidden": [64]},
                "training": {"epochs": 1000, "batch_size": 32},
            },
            headers=auth,
        ).json()
        deadline = time.monotonic() + 60
        url = f"/v1/models/{created['id']}"
        while (client.get(url, headers=auth).json()["progress"]["epoch"] or 0) < 1:
            assert time.monotonic() < deadline, "training never started"
            time.sleep(0.05)
        stopping = time.monotonic()
    stopped_in = time.monotonic() - stopping
    assert stopped_in < 10, f"shutdown took {stopped_in:.1f} s"
    with database(settings.resolved_database_url).read() as session:
        model = session.get(Model, created["id"])
        assert model is not None and model.status == "queued" and model.error is None
    with TestClient(create_app(settings)) as client:  # the next start picks it up again
        deadline = time.monotonic() + 60
        while client.get(f"/v1/models/{created['id']}", headers=auth).json()["status"] != (
            "training"
        ):
            assert time.monotonic() < deadline, "training did not resume"
            time.sleep(0.05)
