"""The certificate hash chain: verification finds tampering; PostgreSQL refuses edits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.exc import DBAPIError

from app.core.db import append_only
from app.core.db.session import database, engine_for
from app.core.db.tables import PublishedCheckpoint
from app.core.ledger.certificates import (
    GENESIS,
    append_certificate,
    append_certificates,
    certificate_documents,
    release_documents,
    verify_chain,
)
from app.privacy.lineage import history_from_certificates
from tests.conftest import Api

ROOT = Path(__file__).resolve().parents[2]


SIGNER = Ed25519PrivateKey.generate()  # the log's key, as a worker passes it in


def fields(request_id: int, eps: float = 0.0) -> dict:
    return {
        "request_id": request_id,
        "model_id": 1,
        "from_version": 1,
        "to_version": 2,
        "method": "retrain",
        "guarantee": "exact",
        "epsilon": eps,
        "delta": 0.0,
        "cumulative_epsilon": eps,
        "cumulative_delta": 0.0,
        "n_removed": 1,
        "sentence": "test",
    }


def write_chain(url: str, n: int = 4) -> None:
    for i in range(n):
        with database(url).write() as session:
            append_certificate(session, fields(i + 1), SIGNER)


def test_chain_links_and_verifies(db_url: str) -> None:
    write_chain(db_url)
    with database(db_url).write() as session:
        result = verify_chain(session)
        first = session.execute(sa.text("SELECT prev_hash FROM certificates WHERE seq = 1"))
        assert first.scalar() == GENESIS
    assert result["ok"] and result["checked"] == 4


def test_a_batch_appends_in_order_and_releases_read_one_per_version(db_url: str) -> None:
    """`append_certificates` links a coalesced update's certificates in order with one flush;
    the lineage reads one certificate per version and finds the same history as all of them."""
    noisy = {"guarantee": "certified", "sigma": 2.0, "sensitivity": 0.5, "delta": 1e-6}
    with database(db_url).write() as session:
        for version in (2, 3, 4):
            batch = [
                {**fields(10 * version + i, eps=0.5), **noisy, "to_version": version}
                for i in range(3)
            ]
            certs = append_certificates(session, batch, SIGNER)
            assert [c.seq for c in certs] == sorted(c.seq for c in certs)
            assert all(c.id is not None for c in certs)
    with database(db_url).read(streaming=True) as session:
        assert verify_chain(session)["ok"]
        every = certificate_documents(session, 1)
        releases = release_documents(session, 1)
    assert len(every) == 9 and [d["to_version"] for d in releases] == [2, 3, 4]
    assert [d["request_id"] for d in releases] == [20, 30, 40]
    history = history_from_certificates(releases)
    assert len(history) == 3 and history == history_from_certificates(every)


def test_an_append_reads_both_heads_at_once_and_inserts_a_batch_in_one_statement(
    db_url: str,
) -> None:
    """A coalesced update's certificates go in with one INSERT, each tree's new nodes with
    one, the signed head with one, after a single read of the chain's and the tree's heads;
    on PostgreSQL the four INSERTs are one statement (issue 28: every statement of the
    commit is on the path to a certificate)."""
    write_chain(db_url, 3)
    engine = engine_for(db_url)
    statements: list[str] = []

    def seen(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        statements.append(" ".join(statement.split()).lower())

    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        with database(db_url).write() as session:
            certs = append_certificates(session, [fields(10 + i) for i in range(3)], SIGNER)
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)
    reads = [s for s in statements if s.startswith("select") and "advisory" not in s]
    writes = [s for s in statements if s.startswith(("insert", "with"))]
    tables = ["merkle_nodes", "public_nodes", "tree_heads", "certificates"]
    if db_url.startswith("postgresql"):
        assert len(writes) == 1, statements
        assert [writes[0].index(f"insert into {t}") for t in tables] == sorted(
            writes[0].index(f"insert into {t}") for t in tables
        )
    else:
        assert [w.split("(")[0].strip() for w in writes] == [f"insert into {t}" for t in tables]
    assert len(reads) == 1 and "tree_heads" in reads[0] and "certificates" in reads[0]
    assert [c.seq for c in certs] == [4, 5, 6] and all(c.id is not None for c in certs)
    with database(db_url).read(streaming=True) as session:
        assert verify_chain(session)["ok"]


def tamper(url: str, sql: str) -> None:
    with engine_for(url).begin() as conn, append_only.lifted(conn):
        conn.exec_driver_sql(sql)


@pytest.mark.parametrize(
    "sql,reason",
    [
        ("UPDATE certificates SET epsilon = 5.0 WHERE seq = 3", "column epsilon"),
        (
            "UPDATE certificates SET body = replace(body, '\"test\"', '\"edited\"') WHERE seq = 3",
            "entry_hash",
        ),
        ("DELETE FROM certificates WHERE seq = 3", "prev_hash"),
    ],
)
def test_verify_names_first_bad_certificate(db_url: str, sql: str, reason: str) -> None:
    write_chain(db_url)
    tamper(db_url, sql)
    with database(db_url).write() as session:
        result = verify_chain(session)
    assert not result["ok"]
    assert result["first_bad"]["seq"] in (3, 4) and reason in result["first_bad"]["reason"]
    assert result["checked"] == 2


def test_the_log_tables_refuse_update_and_delete(db_url: str) -> None:
    """On PostgreSQL and SQLite alike: the chain, the tree and the heads; and the
    public log's tree and published checkpoints."""
    write_chain(db_url, 1)
    with database(db_url).write() as session:
        session.add(PublishedCheckpoint(tree_size=1, note="a signed note", cosigners=0))
    for sql in (
        "UPDATE checkpoints SET note = 'x'",
        "DELETE FROM checkpoints",
        "UPDATE public_nodes SET hash = 'x'",
        "DELETE FROM public_nodes",
        "UPDATE certificates SET epsilon = 1",
        "DELETE FROM certificates",
        "UPDATE merkle_nodes SET hash = 'x'",
        "DELETE FROM merkle_nodes",
        "UPDATE tree_heads SET root_hash = 'x'",
        "DELETE FROM tree_heads",
    ):
        with pytest.raises(DBAPIError, match="append-only"), engine_for(db_url).begin() as c:
            c.exec_driver_sql(sql)


def test_export_verifies_with_the_standalone_script(api: Api, tmp_path: Path) -> None:
    write_chain(api.url, 3)
    response = api.get("/v1/audit/export", role="auditor")
    lines = response.text.strip().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["seq"] == 1
    path = tmp_path / "audit.jsonl"
    path.write_text(response.text)
    script = ROOT / "scripts" / "verify_audit.py"
    ok = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True)
    assert ok.returncode == 0 and "chain holds: 3" in ok.stdout
    row = json.loads(lines[1])
    row["body"] = row["body"].replace('"test"', '"forged"')
    path.write_text("\n".join([lines[0], json.dumps(row), lines[2]]) + "\n")
    bad = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True)
    assert bad.returncode != 0 and "line 2" in bad.stderr
    verify = api.get("/v1/audit/verify", role="auditor").json()
    assert verify["ok"] and verify["checked"] == 3
