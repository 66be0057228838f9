"""Samples' subject tokens in `subject_tokens`: a
registration writes its rows first and its subject tokens last, sorted, as it writes its id
tokens; every row that names a subject has exactly its token there and an append's rows have
theirs; a subject's rows are found through them (listing, deletion); a registration that fails
leaves none; the migration moves the tokens of a database that had them on `samples`."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from alembic import command
from sqlalchemy import func, select

from app.core.db.migrate import alembic_config
from app.core.db.session import database
from app.core.db.tables import Sample
from app.core.services import subject_tokens
from tests.conftest import Api
from tests.integration.test_registration import BIG, FailsSecondCall, register_big_failing
from tests.support import factories

WITH_SUBJECTS = {**BIG, "subject_size": 3}  # 12,000 rows: a job, three rows a person


def subject_counts(url: str, dataset_id: int) -> tuple[int, int, int]:
    """(the dataset's subject tokens in either table, those whose sample is the dataset's row
    with that subject token, the dataset's rows that name a subject)."""
    tokens, matched = factories.token_counts(url, dataset_id, subject_tokens.BOTH, "subject_id")
    with database(url).read() as session:
        named = session.scalar(
            select(func.count())
            .select_from(Sample)
            .where(Sample.dataset_id == dataset_id, Sample.subject_id.is_not(None))
        )
    return tokens, matched, int(named or 0)


def test_every_row_of_a_subject_has_its_token_and_is_found_through_it(api: Api) -> None:
    answer = api.post("/v1/datasets", json=WITH_SUBJECTS)
    assert answer.status_code == 202, answer.text
    dataset_id = answer.json()["id"]
    assert api.wait(f"/v1/datasets/{dataset_id}", ("ready", "failed"))["status"] == "ready"
    assert subject_counts(api.url, dataset_id) == (12_000, 12_000, 12_000)

    buffer = io.BytesIO()  # an append: two rows of a person already there, one of a new one
    np.savez(
        buffer,
        X=np.ones((3, 4), dtype=np.float32),
        y=np.array([0, 1, 0]),
        ids=np.array(["a0", "a1", "a2"]),
        subjects=np.array(["subject-7", "subject-7", "newcomer"]),
    )
    appended = api.post(
        f"/v1/datasets/{dataset_id}/samples", files={"file": ("a.npz", buffer.getvalue())}
    )
    assert appended.status_code == 201, appended.text
    assert subject_counts(api.url, dataset_id) == (12_003, 12_003, 12_003)
    listed = api.get(f"/v1/datasets/{dataset_id}/samples", params={"subject": "subject-7"})
    assert listed.json()["total"] == 5, listed.text
    assert {s["external_id"] for s in listed.json()["items"]} == {"21", "22", "23", "a0", "a1"}

    erased = api.post(
        "/v1/deletions", json={"dataset_id": dataset_id, "subject_ids": ["subject-7"]}
    )
    assert erased.status_code == 202 and erased.json()["status"] == "done", erased.text
    assert erased.json()["n_samples"] == 5
    listed = api.get(f"/v1/datasets/{dataset_id}/samples", params={"subject": "subject-7"})
    assert listed.json()["total"] == 0


def test_a_registration_that_fails_writing_its_subject_tokens_leaves_none(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing = FailsSecondCall(subject_tokens.insert)
    monkeypatch.setattr(subject_tokens, "insert", failing)
    monkeypatch.setitem(BIG, "subject_size", 3)  # register_big_failing registers BIG
    dataset_id = register_big_failing(api)
    assert failing.calls == 2  # one chunk of subject tokens had committed
    assert api.get(f"/v1/datasets/{dataset_id}").json()["status"] == "failed"
    assert subject_counts(api.url, dataset_id) == (0, 0, 0)


def test_the_migration_moves_the_subject_tokens_and_back(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    command.upgrade(alembic_config(url), "0026")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO datasets (id, name, kind, source, feature_shape, n_classes, n_samples,"
            " status, created_at) VALUES (1, 'd', 'tabular', 'x', '[2]', 2, 3, 'ready',"
            " '2026-01-01')"
        )
        conn.execute(
            "INSERT INTO samples (id, dataset_id, external_id, subject_id, split, status) VALUES"
            " (1, 1, 't1', 's_b', 'train', 'active'), (2, 1, 't2', 's_a', 'test', 'active'),"
            " (3, 1, 't3', NULL, 'train', 'active'), (4, 1, 't4', 's_b', 'train', 'erased')"
        )
    command.upgrade(alembic_config(url), "head")
    with sqlite3.connect(path) as conn:
        assert conn.execute(
            "SELECT dataset_id, token, sample_id FROM subject_tokens"
        ).fetchall() == [(1, "s_a", 2), (1, "s_b", 1), (1, "s_b", 4)]
        indexes = {row[1] for row in conn.execute("PRAGMA index_list('samples')")}
        assert "ix_samples_dataset_subject" not in indexes
    command.downgrade(alembic_config(url), "0026")
    with sqlite3.connect(path) as conn:
        indexes = {row[1] for row in conn.execute("PRAGMA index_list('samples')")}
        assert "ix_samples_dataset_subject" in indexes
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert "subject_tokens" not in tables
