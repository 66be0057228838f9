"""The `data_keys` table: create, load (unwrapped) and destroy data keys in bulk.

On PostgreSQL the table is hash-partitioned on the key id (migration 0016): destroying keys
notes the partitions they were in (`destroyed_in`), so that compaction rewrites only those
(app/storage/erasure.py) instead of the whole table."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID, uuid4

from sqlalchemy import Connection, bindparam, delete, select
from sqlalchemy.orm import Session

from app.db.bulk import driver_uuid, insert_rows
from app.db.chunks import chunked
from app.db.session import rowcount
from app.db.tables import Base
from app.storage.crypto import Keyring

if TYPE_CHECKING:
    import psycopg


def create_keys(session: Session, ring: Keyring, count: int) -> list[tuple[UUID, bytes]]:
    """`count` fresh data keys, stored wrapped: [(key_id, raw key)]. Ids are random UUIDs, so
    one bulk insert needs no RETURNING (row-at-a-time on SQLite)."""
    fresh = new_keys(ring, count)
    store_keys(session.connection(), ring, fresh)
    return [(key_id, raw) for key_id, raw, _ in fresh]


def new_keys(ring: Keyring, count: int) -> list[tuple[UUID, bytes, bytes]]:
    """`count` fresh data keys, not yet stored: [(key_id, raw, wrapped)]. No database: a
    registration makes the next chunk's keys while the previous chunk is written."""
    return [(uuid4(), *ring.new_data_key()) for _ in range(count)]


def store_keys(conn: Connection, ring: Keyring, fresh: list[tuple[UUID, bytes, bytes]]) -> None:
    """Insert the wrapped form of `new_keys`'s keys (the raw form is never stored)."""
    insert_rows(  # the driver's executemany: per-row parameter processing cost more than AES
        conn,
        Base.metadata.tables["data_keys"],
        ("id", "wrapped", "kek_id"),
        [(driver_uuid(conn, key_id), wrapped, ring.kek_id) for key_id, _, wrapped in fresh],
    )


def load_keys(session: Session, ring: Keyring, key_ids: list[UUID]) -> dict[UUID, bytes]:
    """The raw data keys for these ids; a destroyed key is simply absent."""
    return {k: ring.unwrap(w) for k, w in wrapped_keys(session, key_ids).items()}


def wrapped_keys(session: Session, key_ids: list[UUID]) -> dict[UUID, bytes]:
    """The stored (wrapped) form of these keys; a destroyed key is simply absent. Read by id
    with a statement PostgreSQL plans with the ids (`_unprepared`)."""
    out: dict[UUID, bytes] = {}
    postgres = session.get_bind().dialect.name == "postgresql"
    conn = session.connection()
    for chunk in chunked(sorted(set(key_ids))):
        if postgres:
            out.update(_unprepared(conn, _READ_WRAPPED, chunk))
        else:
            out.update((k, w) for k, w in conn.execute(_READ, {"ids": chunk}))
    return out


_KEYS = Base.metadata.tables["data_keys"]
_DESTROY = delete(_KEYS).where(_KEYS.c.id.in_(bindparam("ids", expanding=True)))
_READ = select(_KEYS.c.id, _KEYS.c.wrapped).where(_KEYS.c.id.in_(bindparam("ids", expanding=True)))
# PostgreSQL: one statement text for any number of keys. Never prepared (`_unprepared`).
_READ_WRAPPED = "SELECT id, wrapped FROM data_keys WHERE id = ANY(%s)"
_DESTROY_NOTING = "DELETE FROM data_keys WHERE id = ANY(%s) RETURNING tableoid::regclass::text"


def _unprepared(conn: Connection, statement: str, key_ids: list[UUID]) -> list[Any]:
    """Run a statement on the key table that PostgreSQL plans with these ids, pruned to their
    partitions: never prepared. Every compaction's VACUUM FULL rewrites partitions, which
    invalidates a prepared statement's plans, and PostgreSQL then rebuilt a generic plan over
    all 128 partitions to compare it with the custom one (6.4 ms of planning per deletion for
    the deletion of keys alone, bench.pg_time)."""
    raw = cast("psycopg.Connection[Any]", conn.connection.dbapi_connection)
    threshold, raw.prepare_threshold = raw.prepare_threshold, None  # this statement only
    try:  # through SQLAlchemy: its errors, retries and disconnect handling apply as usual
        return list(conn.exec_driver_sql(statement, (key_ids,)).all())
    finally:
        raw.prepare_threshold = threshold


def destroy_keys(session: Session, key_ids: list[UUID]) -> int:
    """Delete these keys: what they sealed can no longer be opened. Returns how many. On
    PostgreSQL the tables they were deleted from are noted for this process's next compaction
    (noted before the commit: compacting a table whose delete rolled back costs time, not
    correctness)."""
    destroyed = 0
    postgres = session.get_bind().dialect.name == "postgresql"
    conn = session.connection()
    for chunk in chunked(sorted(set(key_ids))):
        if not postgres:
            destroyed += rowcount(conn.execute(_DESTROY, {"ids": chunk}))
            continue
        found: list[str] = [row[0] for row in _unprepared(conn, _DESTROY_NOTING, chunk)]
        destroyed += len(found)
        _note(_where(session), set(found))
    return destroyed


_LOCK = threading.Lock()
_DESTROYED: dict[str, set[str]] = {}  # database -> tables holding keys destroyed, not compacted


def _where(session: Session) -> str:
    return session.get_bind().engine.url.render_as_string()


def _note(database: str, tables: set[str]) -> None:
    with _LOCK:
        _DESTROYED.setdefault(database, set()).update(tables)


def destroyed_in(database: str) -> set[str]:
    """Take the tables (data_keys' partitions) in which this process destroyed keys since the
    last call, for `database` (its URL): the caller compacts them, or gives them back with
    `note_destroyed` when it could not."""
    with _LOCK:
        return _DESTROYED.pop(database, set())


def has_destroyed(database: str) -> bool:
    """Whether this process destroyed keys in `database` since its last compaction."""
    with _LOCK:
        return bool(_DESTROYED.get(database))


def note_destroyed(database: str, tables: set[str]) -> None:
    """Give back tables a compaction did not reach: the next one retries them."""
    _note(database, tables)
