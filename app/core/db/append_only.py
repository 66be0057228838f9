"""Append-only tables, enforced by the database itself: the certificates' hash
chain, the Merkle tree's nodes and the signed tree heads refuse UPDATE and DELETE, on
PostgreSQL and on SQLite alike. Whoever must rewrite them (a restore, or a test playing an
operator who rewrites history) has to lift the triggers first, which `lifted` does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, text

TABLES = ("certificates", "merkle_nodes", "tree_heads")  # since migration 0009
CHECKPOINTS = ("checkpoints",)  # since migration 0012: published checkpoints
PUBLIC_TREE = ("public_nodes",)  # since migration 0013: the public log's tree

_PG_FUNCTION = """
CREATE OR REPLACE FUNCTION lethe_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP;
END;
$$ LANGUAGE plpgsql
"""


def install(conn: Connection, tables: tuple[str, ...] = TABLES) -> None:
    """Create the triggers on these append-only tables (idempotent); a migration names the
    tables it made append-only."""
    for statement in _statements(conn.dialect.name, tables, create=True):
        conn.execute(text(statement))


def drop(conn: Connection, tables: tuple[str, ...] = TABLES) -> None:
    for statement in _statements(conn.dialect.name, tables, create=False):
        conn.execute(text(statement))


@contextmanager
def lifted(conn: Connection) -> Iterator[Connection]:
    """The tree's triggers off for what runs inside, on again after (in the same
    transaction); published checkpoints stay append-only even then."""
    drop(conn, TABLES + PUBLIC_TREE)
    try:
        yield conn
    finally:
        install(conn, TABLES + PUBLIC_TREE)


def _statements(dialect: str, tables: tuple[str, ...], create: bool) -> list[str]:
    out: list[str] = []
    if dialect == "postgresql":
        if create:
            out.append(_PG_FUNCTION)
        for table in tables:
            out.append(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            if create:
                out.append(
                    f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                    "FOR EACH ROW EXECUTE FUNCTION lethe_append_only()"
                )
    elif dialect == "sqlite":
        for table in tables:
            for op in ("update", "delete"):
                name = f"{table}_append_only_{op}"
                out.append(f"DROP TRIGGER IF EXISTS {name}")
                if create:
                    out.append(
                        f"CREATE TRIGGER {name} BEFORE {op.upper()} ON {table} BEGIN "
                        f"SELECT RAISE(ABORT, '{table} is append-only: {op.upper()} refused'); "
                        "END"
                    )
    return out
