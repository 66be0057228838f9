"""Issue 26 through the service: nothing recovers an erased person from the database alone
(fingerprints and Idempotency-Keys), receipts carry no other request, and erased is answered
as unknown to whoever did not erase it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy import LargeBinary, String, Text, select

from app.db.migrate import alembic_config
from app.db.session import database, engine_for
from app.db.tables import Base, Dataset
from app.schemas import DeletionCreate
from app.services.deletions import request_fingerprint
from tests.conftest import Api


def train_ids(api: Api, dataset_id: int, n: int, offset: int = 0) -> list[str]:
    page = api.get(
        f"/v1/datasets/{dataset_id}/samples",
        params={"split": "train", "limit": n, "offset": offset},
    ).json()
    return [s["external_id"] for s in page["items"]]


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
    with database(url).write() as session:  # a dataset for the request to belong to
        session.add(
            Dataset(
                name="d", kind="tabular", source="t", feature_shape=[2], n_classes=2, n_samples=0
            )
        )
    with engine_for(url).begin() as conn:
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
