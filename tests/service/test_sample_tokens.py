"""Samples' id tokens in `sample_tokens`: a registration
writes its rows first and its tokens last, sorted; every row has exactly its token; an id is
held once per dataset; a failed registration leaves no token; the migration moves the tokens
of a database that had them on `samples` and loses no row that refers to a sample."""

from __future__ import annotations

import base64
import hashlib
import hmac
import sqlite3
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from app.core.db.bulk import insert_rows
from app.core.db.migrate import alembic_config
from app.core.db.session import database
from app.core.db.tables import Sample
from app.core.formats import dataset_files
from app.core.schemas import BuiltinDatasetIn
from app.core.services import sample_tokens
from app.core.services.registration import SubjectTokens, insert_sealed, sealed_row
from app.core.services.sample_tokens import TOKEN_CHARS
from app.core.storage.crypto import TOKEN_PREFIX, Keyring
from app.core.storage.keystore import new_keys
from tests.conftest import Api
from tests.integration.test_registration import BIG, FailsSecondCall, register_big_failing
from tests.support import factories


def token_counts(url: str, dataset_id: int) -> tuple[int, int]:
    """(the dataset's id tokens in either table, those whose sample is its row with that
    token)."""
    return factories.token_counts(url, dataset_id, sample_tokens.BOTH, "external_id")


def test_every_registered_row_has_its_token_and_an_id_is_held_once(api: Api) -> None:
    answer = api.post("/v1/datasets", json=BIG)
    dataset = api.wait(f"/v1/datasets/{answer.json()['id']}", ("ready", "failed"))
    assert dataset["status"] == "ready"
    assert token_counts(api.url, dataset["id"]) == (12_000, 12_000)
    # a client's id finds its row through the table: a deletion by name, and an unknown one
    who = api.get(f"/v1/datasets/{dataset['id']}/samples", params={"limit": 1}).json()
    named = who["items"][0]["external_id"]
    body = {"dataset_id": dataset["id"], "sample_ids": [named]}
    assert api.post("/v1/deletions", json=body).status_code == 202
    unknown = api.post("/v1/deletions", json={**body, "sample_ids": ["no-such-row"]})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "sample_not_found"
    # the same id again in the dataset breaks the table's primary key, in the same commit
    ring = api.runtime.keyring
    parsed = dataset_files.load_builtin(BuiltinDatasetIn.model_validate({**BIG, "n_samples": 10}))
    keys = new_keys(ring, 1)
    row = sealed_row(ring, dataset["id"], parsed, 0, keys[0][1], SubjectTokens(ring, dataset["id"]))
    with pytest.raises(IntegrityError), database(api.url).write() as session:
        insert_sealed(session, ring, dataset["id"], keys, [row])
    assert token_counts(api.url, dataset["id"]) == (12_000, 12_000)


def test_a_registration_that_fails_writing_its_tokens_leaves_none(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failing in its rows phase is tests/integration/test_registration.py's; here, after one
    chunk of tokens has committed."""
    failing = FailsSecondCall(sample_tokens.insert_sorted)
    monkeypatch.setattr(sample_tokens, "insert_sorted", failing)
    dataset_id = register_big_failing(api)
    assert failing.calls == 2  # one chunk of tokens had committed
    assert api.get(f"/v1/datasets/{dataset_id}").json()["status"] == "failed"
    assert token_counts(api.url, dataset_id) == (0, 0)
    with database(api.url).read() as session:
        assert not session.scalar(select(func.count()).select_from(Sample))


def test_sorted_tokens_come_out_in_the_databases_order(tmp_path: Path) -> None:
    heads = ["b", "A", "-x", "_", "a9", "a", "0", "Z_"]  # ASCII: - < digits < A-Z < _ < a-z
    tokens = [TOKEN_PREFIX + h.ljust(TOKEN_CHARS, "Q") for h in heads]
    gathered = sample_tokens.SortedTokens()
    base = 2**32 - 103  # ids past 2**32: the offsets from the first are what is held
    ids = [base + i for i in (101, 102, 103, 104, 107, 108, 109, 112)]
    gathered.add(tokens[:4], ids[:4])
    gathered.add(tokens[4:], ids[4:])  # another writer took the two ids between
    assert len(gathered) == 8
    out = [pair for chunk in gathered.chunks(3) for pair in chunk]
    assert [len(c) for c in sample_tokens.SortedTokens().chunks(3)] == []
    with sqlite3.connect(tmp_path / "order.db") as conn:
        conn.execute("CREATE TABLE t (token TEXT)")
        conn.executemany("INSERT INTO t VALUES (?)", [(t,) for t in tokens])
        ordered = [t for (t,) in conn.execute("SELECT token FROM t ORDER BY token")]
    assert [t for t, _ in out] == ordered
    assert dict(out) == dict(zip(tokens, ids, strict=True))
    with pytest.raises(ValueError):  # a token the array would cut short is refused
        sample_tokens.SortedTokens().add([tokens[0] + "x"], [1])


def test_the_migration_moves_the_tokens_and_loses_no_row_that_refers_to_a_sample(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    command.upgrade(alembic_config(url), "0025")
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO datasets (id, name, kind, source, feature_shape, n_classes, n_samples,"
            " status, created_at) VALUES (1, 'd', 'tabular', 'x', '[2]', 2, 2, 'ready',"
            " '2026-01-01')"
        )
        conn.execute(
            "INSERT INTO samples (id, dataset_id, external_id, split, status) VALUES"
            " (1, 1, 't1_b', 'train', 'active'), (2, 1, 't1_a', 'test', 'active')"
        )
        conn.execute(
            "INSERT INTO models (id, name, dataset_id, architecture, training, method,"
            " privacy, status, progress, created_at, updated_at) VALUES (1, 'm', 1, '{}',"
            " '{}', '{}', '{}', 'ready', '{}', '2026-01-01', '2026-01-01')"
        )
        conn.execute("INSERT INTO model_samples (model_id, sample_id) VALUES (1, 1), (1, 2)")
    command.upgrade(alembic_config(url), "head")
    with sqlite3.connect(path) as conn:
        # dropping the old `samples` with foreign keys on would have cascaded to these
        assert conn.execute("SELECT count(*) FROM model_samples").fetchone() == (2,)
        assert conn.execute(
            "SELECT dataset_id, token, sample_id FROM sample_tokens ORDER BY token"
        ).fetchall() == [(1, "t1_a", 2), (1, "t1_b", 1)]
        # the token is no longer unique on `samples` (the table's key holds it)
        conn.execute(
            "INSERT INTO samples (id, dataset_id, external_id, split, status) VALUES"
            " (3, 1, 't1_a', 'train', 'active')"
        )
        conn.execute("DELETE FROM samples WHERE id = 3")
    command.downgrade(alembic_config(url), "0025")  # and back
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM model_samples").fetchone() == (2,)
        with pytest.raises(sqlite3.IntegrityError):  # unique on `samples` again
            conn.execute(
                "INSERT INTO samples (id, dataset_id, external_id, split, status) VALUES"
                " (3, 1, 't1_a', 'train', 'active')"
            )


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_an_appends_ids_leave_out_rows_another_append_committed_meanwhile(api: Api) -> None:
    """On PostgreSQL another append to the dataset may commit rows with larger ids between an
    append's `last_sample_id` and its read-back: they are not taken for its own."""
    dataset_id = api.post("/v1/datasets", json={**BIG, "n_samples": 20}).json()["id"]
    samples = Sample.__table__
    columns = ("dataset_id", "external_id", "split", "status", "append_id")
    db = database(api.url)
    with db.write() as mine:
        conn = mine.connection()
        after = sample_tokens.last_sample_id(conn)
        with db.write() as other:  # its own connection and transaction, committed first
            other_rows = [(dataset_id, f"t:other{i}", "train", "pending", 2) for i in range(3)]
            insert_rows(other.connection(), samples, columns, other_rows)
        insert_rows(conn, samples, columns, [(dataset_id, "t:mine", "train", "pending", 1)])
        ids = sample_tokens.inserted_ids(conn, dataset_id, after, 1, append_id=1)
        mine.rollback()
    with db.read() as session:
        others = session.scalars(select(Sample.id).where(Sample.append_id == 2)).all()
    assert len(ids) == 1 and len(others) == 3 and ids[0] not in others


def test_tokens_made_together_are_hmac_sha256_under_the_identifier_key() -> None:
    """`Keyring.tokens` copies HMAC's two keyed hashes and encodes many MACs at once: each
    token must still be the standard library's HMAC-SHA256 of "kind\\0dataset\\0id" under the
    identifier key, cut to 24 bytes, in URL-safe base64 (what every stored token already is)."""
    master = bytes(range(32))
    ring = Keyring(master)
    key = hmac.new(master, b"lethe/identifiers/v1", hashlib.sha256).digest()
    values = ["a", "", "ünïcødé 漢字", "x" * 300, *(f"row-{i}" for i in range(500))]

    def expected(kind: str, dataset_id: int, value: str) -> str:
        mac = hmac.new(key, f"{kind}\0{dataset_id}\0{value}".encode(), hashlib.sha256).digest()
        return TOKEN_PREFIX + base64.urlsafe_b64encode(mac[:24]).decode()

    assert ring.tokens("sample", 7, values) == [expected("sample", 7, v) for v in values]
    assert ring.token("suppressed-subject", 0, "p") == expected("suppressed-subject", 0, "p")
    assert ring.tokens("sample", 7, []) == []
    assert ring.tokens("sample", 8, ["a"]) != ring.tokens("sample", 7, ["a"])
