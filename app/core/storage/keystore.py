"""The key tables: create, load (unwrapped) and destroy data keys in bulk.

Samples' keys are in `data_keys` (`KeyTable.samples`); blobs' keys and requests' commitment
openings, each dying with its version or request, in the small `short_keys`
(`KeyTable.short`, migration 0018). On PostgreSQL `data_keys` is hash-partitioned on the key
id (migration 0016): destroying keys notes the tables they were in (`destroyed_in`: the
partitions, or `short_keys`), so that compaction rewrites only those (app/core/storage/erasure.py)
instead of the whole table."""

from __future__ import annotations

import enum
import os
import threading
import time
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from sqlalchemy import BindParameter, Connection, bindparam, delete, select
from sqlalchemy.orm import Session

from app.core.db.bulk import driver_uuids, insert_rows
from app.core.db.chunks import CHUNK, chunked
from app.core.db.session import Database, rowcount
from app.core.db.tables import Base
from app.core.storage.crypto import Keyring

if TYPE_CHECKING:
    import psycopg


class KeyTable(enum.StrEnum):
    """Which table holds a key: a sample's, or a blob's or commitment opening's."""

    samples = "data_keys"
    short = "short_keys"


def create_keys(
    session: Session, ring: Keyring, count: int, table: KeyTable = KeyTable.samples
) -> list[tuple[UUID, bytes]]:
    """`count` fresh data keys, stored wrapped: [(key_id, raw key)]. Ids are random UUIDs, so
    one bulk insert needs no RETURNING (row-at-a-time on SQLite)."""
    fresh = new_keys(ring, count)
    store_keys(session.connection(), ring, fresh, table)
    return [(key_id, raw) for key_id, raw, _ in fresh]


def new_keys(ring: Keyring, count: int) -> list[tuple[UUID, bytes, bytes]]:
    """`count` fresh data keys, not yet stored: [(key_id, raw, wrapped)]. No database: a
    registration makes the next chunk's keys while the previous chunk is written."""
    return [
        (key_id, raw, wrapped)
        for key_id, (raw, wrapped) in zip(
            time_ordered_ids(count), ring.new_data_keys(count), strict=True
        )
    ]


def time_ordered_ids(count: int) -> list[UUID]:
    """`count` UUIDs laid out as RFC 9562's version 7: 48 bits of Unix milliseconds, then 74
    random bits. Unique as random ones are, but a chunk's keys sit together at the end of the
    key table's index instead of on a random page each (a million random ids made
    every chunk's commit rewrite pages across the whole index)."""
    stamp = time.time_ns() // 1_000_000
    tails = os.urandom(10 * count)
    out = []
    for i in range(count):
        tail = int.from_bytes(tails[10 * i : 10 * (i + 1)], "big")
        value = (stamp << 80) | (0x7 << 76) | ((tail >> 68) & 0xFFF) << 64
        value |= (0b10 << 62) | (tail & ((1 << 62) - 1))
        out.append(UUID(int=value))
    return out


def store_keys(
    conn: Connection,
    ring: Keyring,
    fresh: list[tuple[UUID, bytes, bytes]],
    table: KeyTable = KeyTable.samples,
) -> None:
    """Insert the wrapped form of `new_keys`'s keys (the raw form is never stored)."""
    uuid_of = driver_uuids(conn)
    insert_rows(  # the driver's executemany: per-row parameter processing cost more than AES
        conn,
        Base.metadata.tables[table],
        ("id", "wrapped", "kek_id"),
        [(uuid_of(key_id), wrapped, ring.kek_id) for key_id, _, wrapped in fresh],
    )


def load_keys(
    session: Session, ring: Keyring, key_ids: list[UUID], table: KeyTable = KeyTable.samples
) -> dict[UUID, bytes]:
    """The raw data keys for these ids; a destroyed key is simply absent."""
    return {k: ring.unwrap(w) for k, w in wrapped_keys(session, key_ids, table).items()}


def wrapped_keys(
    session: Session, key_ids: list[UUID], table: KeyTable = KeyTable.samples
) -> dict[UUID, bytes]:
    """The stored (wrapped) form of these keys; a destroyed key is simply absent. Read by id
    with a statement PostgreSQL plans with the ids (`_unprepared`)."""
    out: dict[UUID, bytes] = {}
    postgres = session.get_bind().dialect.name == "postgresql"
    conn = session.connection()
    for chunk in chunked(sorted(set(key_ids))):
        if postgres:
            out.update(_unprepared(conn, _READ_WRAPPED[table], chunk))
        else:
            out.update((k, w) for k, w in conn.execute(_READ[table], {"ids": chunk}))
    return out


_IDS: BindParameter[list[Any]] = bindparam("ids", expanding=True)
_TABLES = {t: Base.metadata.tables[t] for t in KeyTable}
_DESTROY = {t: delete(k).where(k.c.id.in_(_IDS)) for t, k in _TABLES.items()}
_READ = {t: select(k.c.id, k.c.wrapped).where(k.c.id.in_(_IDS)) for t, k in _TABLES.items()}
# PostgreSQL: one statement text for any number of keys. Never prepared (`_unprepared`).
_READ_WRAPPED = {t: f"SELECT id, wrapped FROM {t} WHERE id = ANY(%s)" for t in KeyTable}
_DESTROY_NOTING = {
    t: f"DELETE FROM {t} WHERE id = ANY(%s) RETURNING tableoid::regclass::text" for t in KeyTable
}


def _unprepared(conn: Connection, statement: str, *key_ids: list[UUID]) -> list[Any]:
    """Run a statement on the key table that PostgreSQL plans with these ids (a list per
    parameter), pruned to their partitions: never prepared. Every compaction's VACUUM FULL
    rewrites partitions, which invalidates a prepared statement's plans, and PostgreSQL then
    rebuilt a generic plan over all 128 partitions to compare it with the custom one (most of
    the deletion of keys' time went to planning)."""
    raw = cast("psycopg.Connection[Any]", conn.connection.dbapi_connection)
    threshold, raw.prepare_threshold = raw.prepare_threshold, None  # this statement only
    try:  # through SQLAlchemy: its errors, retries and disconnect handling apply as usual
        return list(conn.exec_driver_sql(statement, key_ids).all())
    finally:
        raw.prepare_threshold = threshold


def destroy_keys(session: Session, key_ids: list[UUID], table: KeyTable = KeyTable.samples) -> int:
    """Delete these keys: what they sealed can no longer be opened. Returns how many. On
    PostgreSQL the tables they were deleted from are noted for this process's next compaction
    (noted before the commit: compacting a table whose delete rolled back costs time, not
    correctness)."""
    destroyed = 0
    postgres = session.get_bind().dialect.name == "postgresql"
    conn = session.connection()
    for chunk in chunked(sorted(set(key_ids))):
        if not postgres:
            destroyed += rowcount(conn.execute(_DESTROY[table], {"ids": chunk}))
            continue
        found: list[str] = [row[0] for row in _unprepared(conn, _DESTROY_NOTING[table], chunk)]
        destroyed += len(found)
        _note(_where(session), set(found))
    return destroyed


def destroy_both(session: Session, short: list[UUID], samples: list[UUID]) -> int:
    """`destroy_keys` of `short` in `KeyTable.short` and of `samples` in `KeyTable.samples`:
    on PostgreSQL one statement when each fits a chunk (a commit's purged blobs' keys and
    openings, and its erased samples' keys: a round trip less)."""
    short, samples = sorted(set(short)), sorted(set(samples))
    one = len(short) <= CHUNK and len(samples) <= CHUNK
    if session.get_bind().dialect.name != "postgresql" or not (short and samples and one):
        return destroy_keys(session, short, KeyTable.short) + destroy_keys(session, samples)
    found = [row[0] for row in _unprepared(session.connection(), _DESTROY_BOTH, short, samples)]
    _note(_where(session), set(found))
    return len(found)


_DESTROY_BOTH = (
    f"WITH short AS ({_DESTROY_NOTING[KeyTable.short]}), "
    f"samples AS ({_DESTROY_NOTING[KeyTable.samples]}) "
    "SELECT * FROM short UNION ALL SELECT * FROM samples"
)


class DestroyedTables:
    """The tables (data_keys' partitions, short_keys) in which this process destroyed keys
    since their last compaction: one per database (`Database.own`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tables: set[str] = set()

    def note(self, tables: set[str]) -> None:
        with self._lock:
            self._tables |= tables

    def take(self) -> set[str]:
        with self._lock:
            taken, self._tables = self._tables, set()
            return taken

    def any(self) -> bool:
        with self._lock:
            return bool(self._tables)


def _where(session: Session) -> DestroyedTables:
    return Database.of(session).own(DestroyedTables)


def _note(where: DestroyedTables, tables: set[str]) -> None:
    where.note(tables)


def destroyed_in(db: Database) -> set[str]:
    """Take the tables in which this process destroyed keys of `db` since the last call: the
    caller compacts them, or gives them back with `note_destroyed` when it could not."""
    return db.own(DestroyedTables).take()


def has_destroyed(db: Database) -> bool:
    """Whether this process destroyed keys in `db` since its last compaction."""
    return db.own(DestroyedTables).any()


def note_destroyed(db: Database, tables: set[str]) -> None:
    """Give back tables a compaction did not reach: the next one retries them."""
    db.own(DestroyedTables).note(tables)
