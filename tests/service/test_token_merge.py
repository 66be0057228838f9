"""Appended rows' tokens wait in the recent tables and a merge moves them into the main ones
: every reader finds a token
in either table (a deletion by id or subject, the duplicate check, a listing by subject); a
merge moves every token once, leaves a dataset with an append under way, gives way to other
work below four times its threshold; the maintenance thread runs it; the migration's
downgrade loses no token."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import Table, func, select
from sqlalchemy.exc import IntegrityError

from app.core.db.migrate import alembic_config
from app.core.db.session import database
from app.core.services import appends, sample_tokens, subject_tokens, token_merge
from app.core.settings import Settings
from app.core.states import DatasetStatus
from app.main import create_app
from tests.conftest import Api, make_keys
from tests.integration.test_appends import append, register, table_csv


def count(url: str, table: Table, dataset_id: int | None = None) -> int:
    query = select(func.count()).select_from(table)
    if dataset_id is not None:
        query = query.where(table.c.dataset_id == dataset_id)
    with database(url).read() as session:
        return int(session.scalar(query) or 0)


def tables(url: str, dataset_id: int) -> dict[str, int]:
    """The dataset's tokens in each of the four tables."""
    named = {
        "ids": sample_tokens.TOKENS,
        "recent_ids": sample_tokens.RECENT,
        "subjects": subject_tokens.SUBJECTS,
        "recent_subjects": subject_tokens.RECENT,
    }
    return {name: count(url, table, dataset_id) for name, table in named.items()}


def merged(rows: int) -> dict[str, int]:
    """The four tables of a dataset of `rows` rows, each naming a subject, after a merge."""
    return {"ids": rows, "recent_ids": 0, "subjects": rows, "recent_subjects": 0}


def erase(api: Api, dataset_id: int, **names: list[str]) -> dict:
    answer = api.post("/v1/deletions", json={"dataset_id": dataset_id, **names})
    assert answer.status_code == 202, answer.text
    return answer.json()


def test_every_reader_finds_an_appended_token_before_and_after_a_merge(api: Api) -> None:
    dataset_id = register(api, table_csv(range(20)))  # person-0000 .. person-0009, two rows each
    assert append(api, dataset_id, table_csv(range(100, 106))).status_code == 201
    # the appended rows' tokens wait in the recent tables; the registration's are in the main
    assert tables(api.url, dataset_id) == {
        "ids": 20,
        "recent_ids": 6,
        "subjects": 20,
        "recent_subjects": 6,
    }
    again = append(api, dataset_id, table_csv(range(104, 108)))  # 104 and 105 are there
    assert again.status_code == 409, again.text
    assert sorted(again.json()["error"]["details"]["ids"]) == ["row-00104", "row-00105"]
    assert erase(api, dataset_id, sample_ids=["row-00100"])["n_samples"] == 1
    by_subject = api.get(f"/v1/datasets/{dataset_id}/samples", params={"subject": "person-0051"})
    assert by_subject.json()["total"] == 2, by_subject.text

    assert token_merge.merge(api.runtime.db, threshold=1).moved == 12
    assert tables(api.url, dataset_id) == merged(26)
    assert token_merge.merge(api.runtime.db, threshold=1).moved == 0  # nothing left to move
    again = append(api, dataset_id, table_csv(range(104, 108)))
    assert again.status_code == 409, again.text
    assert sorted(again.json()["error"]["details"]["ids"]) == ["row-00104", "row-00105"]
    assert erase(api, dataset_id, sample_ids=["row-00101"])["n_samples"] == 1
    # person-0051 owns rows 102 and 103 (both appended); person-0000 rows 0 and 1
    assert erase(api, dataset_id, subject_ids=["person-0051"])["n_samples"] == 2
    assert erase(api, dataset_id, subject_ids=["person-0000"])["n_samples"] == 2
    unknown = api.post(
        "/v1/deletions", json={"dataset_id": dataset_id, "sample_ids": ["row-00999"]}
    )
    assert unknown.status_code == 404
    # an id erased after the merge is still held: appending it again is refused
    assert append(api, dataset_id, table_csv(range(101, 102))).status_code == 409


def test_a_merge_leaves_a_dataset_with_an_append_under_way(api: Api) -> None:
    """The append under way read the tables for duplicates before; the token its racing twin
    committed stays in the recent table, where the twin's key still meets its insert."""
    busy_id = register(api, table_csv(range(10)))
    quiet_id = register(api, table_csv(range(10)))
    assert append(api, busy_id, table_csv(range(100, 101))).status_code == 201
    assert append(api, quiet_id, table_csv(range(100, 104))).status_code == 201
    db = api.runtime.db
    with db.write() as session:
        under_way = appends.begin(session, busy_id, "test")
    # ten waiting, threshold 1: at four times it a merge runs although an append is under way
    assert token_merge.merge(db, threshold=1).moved == 8  # the quiet dataset's ids and subjects
    assert tables(api.url, busy_id)["recent_ids"] == 1
    assert tables(api.url, quiet_id)["recent_ids"] == 0
    # the racing append's insert of the same id meets the waiting token in the recent table
    (token,) = api.runtime.keyring.tokens("sample", busy_id, ["row-00100"])
    with pytest.raises(IntegrityError), db.write() as session:
        sample_tokens.insert_new(session.connection(), busy_id, [token], [10**9])
    # below four times its threshold a merge waits for the append to end
    assert token_merge.merge(db, threshold=1).moved == 0
    appends.discard(api.runtime, under_way, {"code": "test", "message": "ended"})
    with db.read() as session:
        assert appends.get_append(session, busy_id, under_way).status == DatasetStatus.failed
    assert token_merge.merge(db, threshold=1).moved == 2
    assert tables(api.url, busy_id) == merged(11)


def test_a_discarded_append_s_tokens_leave_both_tables(api: Api) -> None:
    dataset_id = register(api, table_csv(range(10)))
    assert append(api, dataset_id, table_csv(range(100, 103))).status_code == 201
    assert token_merge.merge(api.runtime.db, threshold=1).moved == 6
    db = api.runtime.db
    with db.write() as session:
        late = appends.begin(session, dataset_id, "test")
    with db.write() as session:  # a row of the late append's, its token in the recent table
        conn = session.connection()
        after = sample_tokens.last_sample_id(conn)
        session.execute(
            sample_tokens.SAMPLES.insert().values(
                dataset_id=dataset_id,
                external_id="lt1:late",
                split="train",
                status="pending",
                append_id=late,
            )
        )
        (late_row,) = sample_tokens.inserted_ids(conn, dataset_id, after, 1, late)
        sample_tokens.insert_new(conn, dataset_id, ["lt1:late"], [late_row])
    assert tables(api.url, dataset_id)["recent_ids"] == 1
    appends.discard(api.runtime, late, {"code": "test", "message": "ended"})
    assert tables(api.url, dataset_id) == merged(13)


def test_the_maintenance_thread_merges_once_enough_tokens_wait(settings: Settings) -> None:
    merging = settings.model_copy(update={"token_merge_rows": 4, "reconcile_seconds": 0.2})
    url = merging.resolved_database_url
    with TestClient(create_app(merging)) as client:
        api = Api(client=client, url=url, keys=make_keys(url))
        dataset_id = register(api, table_csv(range(10)))
        assert append(api, dataset_id, table_csv(range(100, 103))).status_code == 201
        deadline = time.monotonic() + 60
        # the id tokens move, then the subject tokens (a transaction per batch)
        while tables(url, dataset_id)["recent_subjects"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tables(url, dataset_id) == merged(13)


def test_the_migration_s_downgrade_keeps_the_recent_tokens(tmp_path: Path) -> None:
    path = tmp_path / "lethe.db"
    url = f"sqlite:///{path}"
    command.upgrade(alembic_config(url), "head")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO datasets (id, name, kind, source, feature_shape, n_classes, n_samples,"
            " status, created_at) VALUES (1, 'd', 'tabular', 'x', '[2]', 2, 2, 'ready',"
            " '2026-01-01')"
        )
        conn.execute("INSERT INTO sample_tokens VALUES (1, 't1_a', 1)")
        conn.execute("INSERT INTO sample_tokens_recent VALUES (1, 't1_b', 2)")
        conn.execute("INSERT INTO subject_tokens_recent VALUES (1, 't1_s', 2)")
    command.downgrade(alembic_config(url), "0027")
    with sqlite3.connect(path) as conn:
        assert conn.execute(
            "SELECT dataset_id, token, sample_id FROM sample_tokens ORDER BY token"
        ).fetchall() == [(1, "t1_a", 1), (1, "t1_b", 2)]
        assert conn.execute("SELECT * FROM subject_tokens").fetchall() == [(1, "t1_s", 2)]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "sample_tokens_recent" not in names and "subject_tokens_recent" not in names
    command.upgrade(alembic_config(url), "head")
