"""Erasing a sample once no live model holds it (DESIGN §6), and compacting what it leaves.

Erasure is crypto-shredding (app/core/storage/crypto.py): the sample's data key is destroyed, so its
sealed payload (label, raw ids, features) and its sealed statistics can never be opened again,
wherever their bytes survive; a row sealed in a block leaves the block first, which is sealed
anew under a new key (app/core/storage/sample_blocks.py). `compact_after_erasure` then removes the
destroyed keys' own bytes from the database files: SQLite zeroes freed cells (`secure_delete`)
and the WAL is checkpointed and truncated; PostgreSQL rewrites the partitions of the key table
that this process destroyed keys in (`VACUUM FULL data_keys_p017, ...`; migration 0016), a few
milliseconds each at a million keys, where rewriting the whole table grew with every key ever
made, and the small `short_keys` when blobs' keys or commitment openings were
destroyed.
`compact(db, everything=True)` rewrites both tables whole: at a process's start, for keys
destroyed by a process that died before compacting."""

from __future__ import annotations

import enum
import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from sqlalchemy import BindParameter, Connection, bindparam, null, select, text, update
from sqlalchemy.orm import Session

from app.core.clock import SYSTEM, Clock
from app.core.db.chunks import chunked
from app.core.db.session import Database
from app.core.db.tables import Base, utcnow
from app.core.settings import Settings
from app.core.states import ModelStatus, SampleStatus
from app.core.storage.crypto import Keyring
from app.core.storage.keystore import (
    destroy_both,
    destroyed_in,
    has_destroyed,
    note_destroyed,
)
from app.core.storage.sample_blocks import rewrite

log = logging.getLogger("lethe.erasure")


_SAMPLES, _HOLDINGS, _MODELS, _BLOCKS = (
    Base.metadata.tables[t] for t in ("samples", "model_samples", "models", "sample_blocks")
)
_IDS: BindParameter[list[Any]] = bindparam("ids", expanding=True)
# Built once (building a statement cost more CPU than running it). A sample is
# free when no live model still holds it.
_FREE = select(_SAMPLES.c.id, _SAMPLES.c.key_id, _SAMPLES.c.block_row).where(
    _SAMPLES.c.id.in_(_IDS),
    _SAMPLES.c.status != bindparam("erased"),
    ~select(_HOLDINGS.c.sample_id)
    .join(_MODELS, _MODELS.c.id == _HOLDINGS.c.model_id)
    .where(
        _HOLDINGS.c.sample_id == _SAMPLES.c.id,
        _HOLDINGS.c.removed_version_id.is_(None),
        _MODELS.c.status != bindparam("failed"),
    )
    .exists(),
)
# what an erased sample keeps of its row: no payload, no key, no place in a block
_ERASED = {
    "payload": null(),
    "key_id": null(),
    "block_row": null(),
    "status": bindparam("erased"),
    "erased_at": bindparam("now"),
}
_ERASE = (
    update(_SAMPLES)
    .where(_SAMPLES.c.id.in_(_IDS), _SAMPLES.c.status != bindparam("erased"))
    .values(**_ERASED)
)


# PostgreSQL: both in one statement, the erased samples' former keys returned (the FROM
# subquery reads the rows as they were; the status is checked again on the row updated, so a
# sample erased meanwhile by another transaction is neither counted nor updated twice)
_FREED = _FREE.subquery("free")
_ERASE_FREE = (
    update(_SAMPLES)
    .where(_SAMPLES.c.id == _FREED.c.id, _SAMPLES.c.status != bindparam("erased"))
    .values(**_ERASED)
    .returning(_FREED.c.key_id, _FREED.c.block_row)
)


_LOCK_BLOCKS = (
    select(_BLOCKS.c.key_id)
    .where(_BLOCKS.c.key_id.in_(select(_SAMPLES.c.key_id).where(_SAMPLES.c.id.in_(_IDS))))
    .with_for_update()
)


def erase_payloads(
    session: Session, ring: Keyring, sample_ids: list[int], also: Sequence[UUID] = ()
) -> int:
    """Destroy the data keys of samples no live model still holds, and the short keys `also`
    (requests' commitment openings) with them; a sample sealed in a block leaves it first
    (`sample_blocks.rewrite`: the block sealed again without it under a new key, the old key
    destroyed here). Returns how many samples were erased."""
    erased, keys = 0, list[UUID | None]()
    blocks: dict[UUID, list[int]] = {}
    conn = session.connection()
    postgres = conn.dialect.name == "postgresql"
    for chunk in chunked(sample_ids):
        params = {
            "ids": chunk,
            "erased": SampleStatus.erased,
            "failed": ModelStatus.failed,
            "now": utcnow(),
        }
        if postgres:  # their blocks locked first (a block's rows erased at once wait in
            # turn, instead of each holding a row the other's rewrite moves), then one statement
            conn.execute(_LOCK_BLOCKS, {"ids": chunk})
            freed = conn.execute(_ERASE_FREE, params).all()
        else:
            freed = conn.execute(_FREE, params).all()  # not yet erased, held by no model
            if freed:
                conn.execute(_ERASE, params | {"ids": [row.id for row in freed]})
        erased += len(freed)
        for row in freed:
            if row.block_row is None:
                keys.append(row.key_id)
            elif row.key_id is not None:
                blocks.setdefault(row.key_id, []).append(row.block_row)
    keys += rewrite(session, ring, blocks)
    destroy_both(session, list(also), [k for k in keys if k is not None])
    return erased


class ErasureCount:
    """How many erasures this process has committed to a database (`Database.own`;
    workers/recycle.py reads it)."""

    def __init__(self) -> None:
        self.value = 0


def erasures_here(db: Database) -> int:
    """How many erasures this process has committed (and compacted after) to `db` so far."""
    return db.own(ErasureCount).value


def compact_after_erasure(db: Database, settings: Settings) -> None:
    """Remove destroyed keys' bytes from the database files (run after the erasure commits):
    SQLite's WAL checkpoint at once; PostgreSQL's rewrite of the partitions that lost keys in
    a background thread (`compact_soon`), so the worker's next update does not wait for it.

    A failure is logged, not raised: the erasure itself has committed and the next erasure
    compacts again."""
    db.own(ErasureCount).value += 1
    if not settings.erasure_compaction:
        return
    if db.engine.dialect.name == "postgresql":
        compact_soon(db, settings.compaction_interval_seconds)
        return
    _compact_logged(db)


def _compact_logged(db: Database) -> Compaction | None:
    """`compact(db)`, or None (logged) when it failed: the tables stay noted for a retry."""
    try:
        return compact(db)
    except Exception:
        log.warning("compaction after erasure failed; it is retried", exc_info=True)
        return None


@dataclass
class _Compactor:
    """One database's background compaction: its thread while one runs, whether keys were
    destroyed while it ran (one more run), when its last run began, and the event a clean
    stop sets so that the next run does not wait for its interval."""

    thread: threading.Thread | None = None
    again: bool = False
    last_began: float | None = None  # on `clock`
    hurry: threading.Event = field(default_factory=threading.Event)
    clock: Clock = SYSTEM


_SCHEDULING = threading.Lock()  # guards every _Compactor's thread and again


def compaction_thread(db: Database) -> threading.Thread | None:
    """The thread compacting this database now, if one is."""
    with _SCHEDULING:
        return db.own(_Compactor).thread


def compact_soon(db: Database, interval: float, clock: Clock = SYSTEM) -> None:
    """Compact in a background thread, one per database, at most once per `interval` seconds
    (LETHE_COMPACTION_INTERVAL_SECONDS): the first erasure after a quiet spell is compacted at
    once; those that come within an interval of a run's start wait until that interval has
    passed and go in one run. VACUUM FULL has fixed work per partition (a new file, its
    fsync, the index rebuilt): rewriting after every update took that from every next one."""
    if not has_destroyed(db):
        return
    state = db.own(_Compactor)  # one per database
    with _SCHEDULING:
        state.clock = clock
        if state.thread is not None and state.thread.is_alive():
            state.again = True
            return
        state.thread = threading.Thread(
            target=_compacting, args=(db, interval, state), name="lethe-compact", daemon=True
        )
        state.thread.start()


BACKOFF_SECONDS = 30.0  # the longest wait between runs that left destroyed keys in the files
GIVE_UP_AFTER = 3  # failed runs in a row (errors, not old snapshots) before the thread stops


def _compacting(db: Database, interval: float, state: _Compactor) -> None:
    """Run compactions until no destroyed key is left to compact, each at least `interval`
    after the last one began. A run kept keys when a transaction older than their erasure was
    still open: the next waits one interval, doubling up to BACKOFF_SECONDS, for as long as
    that lasts; a run that failed is retried GIVE_UP_AFTER times (what is left then waits for
    the next erasure or start)."""
    kept_runs, failures, interval = 0, 0, max(interval, 0.05)
    while True:
        wait = min(interval * 2 ** min(kept_runs, 10), BACKOFF_SECONDS)
        began = state.last_began if state.last_began is not None else -wait
        state.clock.wait(state.hurry, began + wait - state.clock.now())
        with _SCHEDULING:
            state.again = False  # a key destroyed from here on asks for one more run
        state.last_began = state.clock.now()
        outcome = _compact_logged(db)
        left = has_destroyed(db)
        kept_runs = kept_runs + 1 if outcome is Compaction.kept else 0
        failures = failures + 1 if outcome is None else 0
        with _SCHEDULING:
            finished = not left or failures >= GIVE_UP_AFTER or state.hurry.is_set()
            if not state.again and finished:
                state.thread = None  # what is left waits for the next erasure or start
                return


def compact_at_start(db: Database, settings: Settings) -> None:
    """A process's first compaction: the whole key table, for keys destroyed by a process that
    died before compacting; if an older transaction kept some, the background thread retries."""
    if compact(db, everything=True) is Compaction.kept:
        compact_soon(db, settings.compaction_interval_seconds)


def finish_compacting(db: Database) -> None:
    """At a clean stop: run the compaction that waits for its interval now and wait for it,
    so the last keys' bytes leave the files and no background thread holds a connection once
    the service has stopped."""
    state = db.own(_Compactor)
    with _SCHEDULING:
        running = state.thread
    if running is None:
        return
    state.hurry.set()
    running.join()
    state.hurry.clear()


class Compaction(enum.Enum):
    """What a compaction did: nothing to do, rewrote the tables clean, or rewrote them but
    kept destroyed keys that an older transaction could still see (noted again)."""

    idle = "idle"
    clean = "clean"
    kept = "kept"


def compact(db: Database, everything: bool = False) -> Compaction:
    """Compact now: SQLite checkpoints and truncates its WAL; PostgreSQL rewrites the key
    table's partitions in which this process destroyed keys (with `everything`, every key
    table that has a page: `_with_pages`)."""
    engine = db.engine
    if engine.dialect.name == "sqlite":
        # Every connection runs with secure_delete (app/core/db/session.py): freed cells are zeroed.
        # TRUNCATE copies the WAL into the main file and empties it, waiting (busy timeout) for
        # readers to leave the old snapshot. A raw connection: no BEGIN around the pragma.
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            busy, _, _ = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            cursor.close()
        finally:
            raw.close()
        if busy:
            log.info("WAL checkpoint was busy; the next erasure retries")
        return Compaction.kept if busy else Compaction.clean
    taken = destroyed_in(db)
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            tables = _with_pages(conn) | taken if everything else taken
            if not tables:
                return Compaction.idle
            settled = _older_transactions_ended(conn)
            kept = _vacuum_full(conn, ", ".join(_quoted(t) for t in sorted(tables)))
    except BaseException:
        note_destroyed(db, taken)
        raise
    if kept or (kept is None and not settled):
        log.warning(
            "compaction kept %s destroyed row(s): a transaction older than their erasure is "
            "still open; compacting again",
            "some" if kept is None else kept,
        )
        note_destroyed(db, tables)
        return Compaction.kept
    return Compaction.clean


# The key tables' leaves (data_keys' partitions, short_keys) that have any page, in their heap
# or TOAST: a relation with none holds no byte of a destroyed key, so rewriting it does
# nothing (an empty database's 128 partitions at each start).
_WITH_PAGES = text(
    "SELECT c.oid::regclass::text FROM pg_class c "
    "WHERE (c.oid IN (SELECT relid FROM pg_partition_tree('data_keys') WHERE isleaf) "
    "OR c.oid = 'short_keys'::regclass) "
    "AND pg_relation_size(c.oid) "
    "+ COALESCE(pg_relation_size(NULLIF(c.reltoastrelid, 0)), 0) > 0"
)


def _with_pages(conn: Connection) -> set[str]:
    """Every key table that could hold a destroyed key's bytes (`_WITH_PAGES`)."""
    return set(conn.execute(_WITH_PAGES).scalars())


# VACUUM VERBOSE's detail for each table it rewrote (src/backend/commands/cluster.c)
_KEPT_DETAIL = re.compile(r"(\d+) dead row versions cannot be removed yet")


def _vacuum_full(conn: Connection, names: str) -> int | None:
    """VACUUM FULL these tables; how many deleted rows it had to keep ("recently dead": an
    open transaction may still see them), read from its VERBOSE report; None when the report
    could not be read (a server whose messages are not in English)."""
    raw = conn.connection.dbapi_connection
    details: list[str] = []

    def heard(notice: Any) -> None:
        if notice.message_detail:
            details.append(notice.message_detail)

    raw.add_notice_handler(heard)  # type: ignore[union-attr]
    try:
        conn.execute(text(f"VACUUM (FULL, VERBOSE) {names}"))
    finally:
        raw.remove_notice_handler(heard)  # type: ignore[union-attr]
    counts = [int(m.group(1)) for d in details if (m := _KEPT_DETAIL.search(d))]
    return sum(counts) if counts else None


SNAPSHOT_WAIT_SECONDS = 5.0

# Other sessions that may still see a row deleted before `since`: of this database, those
# with a snapshot (backend_xmin) from a transaction begun before then; of any database, those
# holding a transaction id from then (ids are cluster-wide: VACUUM keeps rows deleted after
# the oldest running one, whichever database it runs in). Every kind of backend counts (an
# autovacuum ANALYZE holds a snapshot too).
_OLDER_TRANSACTIONS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
    "AND xact_start < :since AND (backend_xid IS NOT NULL "
    "OR (backend_xmin IS NOT NULL AND datname = current_database()))"
)


def _older_transactions_ended(conn: Connection) -> bool:
    """Wait (up to SNAPSHOT_WAIT_SECONDS) until no other transaction that could hold VACUUM
    back began before now. VACUUM FULL keeps a deleted row that an open transaction may still see
    ("recently dead"): a key destroyed while a transaction older than its erasure was open
    would be copied into the rewritten partition and stay there. The erasures being
    compacted have committed, or hold a lock that the VACUUM waits for, so waiting for what
    began before now is enough. False when one is still open."""
    since = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
    deadline = time.monotonic() + SNAPSHOT_WAIT_SECONDS
    while conn.execute(_OLDER_TRANSACTIONS, {"since": since}).scalar_one():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _quoted(table: str) -> str:
    """A table name from `tableoid::regclass` (already quoted where it needs it) checked
    to be a key table (data_keys, one of its partitions, short_keys) before it goes into a
    statement."""
    if not re.fullmatch(r'"?(data_keys(_p\d{3})?|short_keys)"?', table):
        raise ValueError(f"not a key table: {table!r}")
    return table
