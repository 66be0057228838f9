"""Compaction after an erasure on PostgreSQL rewrites only the key table's partitions in which
keys were destroyed (migration 0016), not the whole table: its cost does not grow with the
number of keys."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from alembic import command

from app.core.db.migrate import alembic_config
from app.core.db.session import Database, database, engine_for
from app.core.storage import erasure
from app.core.storage.crypto import Keyring
from app.core.storage.erasure import compact
from app.core.storage.keystore import (
    KeyTable,
    create_keys,
    destroy_both,
    destroy_keys,
    destroyed_in,
    has_destroyed,
    load_keys,
)
from tests.support.clock import ManualClock
from tests.support.databases import PG_ADMIN_URL, own_database


def files(url: str, paged: bool = False) -> dict[str, int]:
    """Each partition of data_keys (with `paged`, each whose heap has any page) and the file
    that holds it now (a rewrite makes a new one)."""
    where = " AND pg_relation_size(c.oid) > 0" if paged else ""
    with database(url).read() as session:
        return dict(
            session.execute(
                sa.text(
                    "SELECT c.relname, c.relfilenode FROM pg_inherits i "
                    "JOIN pg_class c ON c.oid = i.inhrelid "
                    f"WHERE i.inhparent = 'data_keys'::regclass{where}"
                )
            ).all()
        )


def test_compaction_rewrites_only_the_partitions_that_lost_keys(pg_url: str) -> None:
    db, ring = database(pg_url), Keyring(b"k" * 32)
    with db.write() as session:
        keys = [key_id for key_id, _ in create_keys(session, ring, 200)]
    destroyed_in(db)  # nothing left over from earlier tests
    before = files(pg_url)
    assert len(before) == 128

    with db.write() as session:
        holder = session.scalar(
            sa.text("SELECT tableoid::regclass::text FROM data_keys WHERE id = :k"),
            {"k": keys[0]},
        )
        assert destroy_keys(session, [keys[0]]) == 1
    # Another test's transaction on the shared cluster may hold the dead row back: then the
    # run keeps it, notes the partition again, and the next run (as the compaction thread
    # would) rewrites it once more; wait for the run that comes out clean.
    deadline = time.monotonic() + 60
    while compact(db) is erasure.Compaction.kept:
        assert time.monotonic() < deadline, "an older transaction stayed open for a minute"
        time.sleep(0.1)
    after = files(pg_url)
    assert {name for name in before if before[name] != after[name]} == {holder}
    with db.read() as session:
        left = session.scalar(
            sa.text("SELECT count(*) FROM data_keys WHERE id = :k"), {"k": keys[0]}
        )
    assert left == 0

    compact(db)  # nothing destroyed since: nothing is rewritten
    assert files(pg_url) == after

    # a process that destroyed a key and died before compacting: nothing notes its partition
    with db.write() as session:
        orphan = session.scalar(
            sa.text("SELECT tableoid::regclass::text FROM data_keys WHERE id = :k"),
            {"k": keys[1]},
        )
        assert destroy_keys(session, [keys[1]]) == 1
    destroyed_in(db)
    paged = set(files(pg_url, paged=True))
    assert orphan in paged  # (an empty partition's case: the next test, on a database of its own)
    while compact(db, everything=True) is erasure.Compaction.kept:  # a process's start
        assert time.monotonic() < deadline + 60, "an older transaction stayed open"
        time.sleep(0.1)
    now = files(pg_url)
    # every partition with a page is rewritten (the orphan's dead key with it); an empty one
    # holds no byte of any key and is left alone
    assert {name for name in after if now[name] != after[name]} == paged
    with db.read() as session:
        assert not session.scalar(
            sa.text("SELECT count(*) FROM data_keys WHERE id = :k"), {"k": keys[1]}
        )


@pytest.mark.postgres
def test_a_start_on_empty_key_tables_rewrites_nothing() -> None:
    """A process's first compaction on a database with no key has nothing to do (it rewrote
    all 128 empty partitions, 0.45 s at each start)."""
    with own_database("lethe_nokeys") as url:
        before = files(url)
        assert compact(database(url), everything=True) is erasure.Compaction.idle
        assert files(url) == before


@pytest.fixture
def empty_pg_database() -> Iterator[str]:
    """A PostgreSQL database of this test's own, not migrated."""
    with own_database("lethe_keys", migrate=False) as url:
        yield url


@pytest.mark.postgres
def test_migration_0016_partitions_the_keys_a_database_holds_and_back(
    empty_pg_database: str,
) -> None:
    url = empty_pg_database
    command.upgrade(alembic_config(url), "0015")
    keys = {uuid.uuid4(): bytes([i]) * 60 for i in range(50)}
    with engine_for(url).begin() as conn:
        conn.execute(
            sa.text("INSERT INTO data_keys (id, wrapped, kek_id) VALUES (:id, :w, 'k')"),
            [{"id": k, "w": w} for k, w in keys.items()],
        )

    def stored() -> tuple[dict[uuid.UUID, bytes], str, int]:
        with engine_for(url).connect() as conn:
            rows = dict(conn.execute(sa.text("SELECT id, wrapped FROM data_keys")).all())
            kind = conn.scalar(sa.text("SELECT relkind FROM pg_class WHERE relname = 'data_keys'"))
            parts = conn.scalar(
                sa.text("SELECT count(*) FROM pg_inherits WHERE inhparent = 'data_keys'::regclass")
            )
        return {k: bytes(v) for k, v in rows.items()}, kind, parts

    command.upgrade(alembic_config(url), "head")
    assert stored() == (keys, "p", 128)
    command.downgrade(alembic_config(url), "0015")
    assert stored() == (keys, "r", 0)


@pytest.mark.postgres
def test_migration_0018_moves_blob_and_opening_keys_out_of_data_keys_and_back(
    empty_pg_database: str,
) -> None:
    """Blobs' keys and requests' commitment openings move to short_keys, their old copies
    compacted out of data_keys' files (a rewrite of each partition); samples' keys stay."""
    url = empty_pg_database
    command.upgrade(alembic_config(url), "0017")
    sample, blob, opening = (uuid.uuid4() for _ in range(3))
    wrapped = {sample: b"s" * 60, blob: b"b" * 60, opening: b"o" * 60}
    now = "2026-01-01T00:00:00+00:00"
    with engine_for(url).begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # no parent rows
        conn.execute(
            sa.text("INSERT INTO data_keys (id, wrapped, kek_id) VALUES (:id, :w, 'k')"),
            [{"id": k, "w": w} for k, w in wrapped.items()],
        )
        conn.execute(
            sa.text(
                "INSERT INTO blobs (key, key_id, size, sha256, location, created_at) "
                "VALUES ('model-1/weights/x', :k, 1, '', 'filesystem', :now)"
            ),
            {"k": blob, "now": now},
        )
        conn.execute(
            sa.text(
                "INSERT INTO deletion_requests (dataset_id, fingerprint, selector, sample_ids, "
                "already_erased, status, commitment_key_id, created_at, updated_at) "
                "VALUES (1, 'f', '{}', '[]', '[]', 'queued', :k, :now, :now)"
            ),
            {"k": opening, "now": now},
        )
    before = files(url)

    def keys(table: str) -> dict[uuid.UUID, bytes]:
        with engine_for(url).connect() as conn:
            rows = conn.execute(sa.text(f"SELECT id, wrapped FROM {table}")).all()
        return {k: bytes(v) for k, v in rows}

    command.upgrade(alembic_config(url), "0018")
    assert keys("data_keys") == {sample: wrapped[sample]}
    assert keys("short_keys") == {blob: wrapped[blob], opening: wrapped[opening]}
    after = files(url)
    assert all(after[name] != before[name] for name in before)  # the moved bytes left
    command.downgrade(alembic_config(url), "0017")
    assert keys("data_keys") == wrapped


def test_short_and_sample_keys_are_destroyed_together(db_url: str) -> None:
    """`destroy_both` (a commit's blob keys and openings, and its erased samples' keys)
    deletes exactly those keys of each table, on PostgreSQL in one statement, and notes both
    kinds of table for compaction there."""
    db, ring = database(db_url), Keyring(b"k" * 32)
    with db.write() as session:
        short = [k for k, _ in create_keys(session, ring, 3, KeyTable.short)]
        samples = [k for k, _ in create_keys(session, ring, 3)]
    destroyed_in(db)  # nothing left over from earlier tests
    sent: list[str] = []

    def seen(*args: object) -> None:
        sent.append(str(args[2]))

    sa.event.listen(db.engine, "before_cursor_execute", seen)
    try:
        with db.write() as session:
            assert destroy_both(session, short[:2], samples[1:]) == 4
    finally:
        sa.event.remove(db.engine, "before_cursor_execute", seen)
    deletes = [s for s in sent if "DELETE" in s]
    with db.read() as session:
        assert load_keys(session, ring, short, KeyTable.short).keys() == {short[2]}
        assert load_keys(session, ring, samples).keys() == {samples[0]}
    if db_url.startswith("postgresql"):
        assert len(deletes) == 1, sent
        noted = destroyed_in(db)
        assert "short_keys" in noted and any(t.startswith("data_keys_p") for t in noted)
    else:
        assert len(deletes) == 2, sent


@pytest.mark.postgres
def test_a_short_key_destroyed_rewrites_its_small_table_not_a_partition(pg_url: str) -> None:
    """Blobs' keys and openings die in short_keys: compaction rewrites that one small table
    and no partition of the samples' keys."""
    db, ring = database(pg_url), Keyring(b"k" * 32)
    with db.write() as session:
        made = [k for k, _ in create_keys(session, ring, 3, KeyTable.short)]
    destroyed_in(db)  # nothing left over from earlier tests

    def short_file() -> int:
        with db.read() as session:
            return session.scalar(
                sa.text("SELECT relfilenode FROM pg_class WHERE relname = 'short_keys'")
            )

    before, partitions = short_file(), files(pg_url)
    with db.write() as session:
        assert destroy_keys(session, made[:2], KeyTable.short) == 2
        assert destroy_keys(session, made[2:]) == 0  # not a sample's key
    assert destroyed_in(db) == {"short_keys"}
    erasure.note_destroyed(db, {"short_keys"})
    compact(db)
    assert short_file() != before and files(pg_url) == partitions
    with db.read() as session:
        assert load_keys(session, ring, made, KeyTable.short).keys() == {made[2]}


def test_erasures_are_compacted_at_most_once_per_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first erasure after a quiet spell is compacted at once; those that come within
    LETHE_COMPACTION_INTERVAL_SECONDS of a run's start (while it works, or after it ended: a
    stream of sequential deletions) wait until the interval has passed and go in one run; a
    clean stop (`finish_compacting`) runs the waiting one at once. On a manual clock: the
    runs' times are the clock's, whatever the machine's load."""
    clock = ManualClock()
    runs: list[float] = []
    noted = [False]  # keys destroyed and not yet compacted (keystore's notes)
    began, finish = threading.Event(), threading.Event()

    def held_compact(db: object, everything: bool = False) -> erasure.Compaction:
        noted[0] = False
        runs.append(clock.now())
        began.set()
        assert finish.wait(30), "the test never let the run end"
        return erasure.Compaction.clean

    def erased(interval: float) -> None:  # an update destroys keys, then asks for compaction
        noted[0] = True
        erasure.compact_soon(db, interval, clock)  # type: ignore[arg-type]

    def run_started() -> None:
        assert began.wait(30), "no run started"
        began.clear()

    def finished() -> None:
        running = erasure.compaction_thread(db)  # type: ignore[arg-type]
        if running is not None:
            running.join(timeout=30)
            assert not running.is_alive()

    monkeypatch.setattr(erasure, "compact", held_compact)
    monkeypatch.setattr(erasure, "has_destroyed", lambda where: noted[0])
    url = f"postgresql+psycopg://nowhere/{uuid.uuid4().hex}"
    owned: dict[type, object] = {}  # what the fake database holds (`Database.own`)
    db = SimpleNamespace(
        url=url,
        engine=SimpleNamespace(url=sa.make_url(url)),
        own=lambda kind: owned.setdefault(kind, kind()),
    )

    erased(0.4)
    run_started()  # at once
    for _ in range(3):  # three more updates erase while the first run works
        erased(0.4)
    finish.set()
    clock.advance(0.3)
    assert not began.wait(0.05)  # within the interval: no run
    clock.advance(0.1)
    run_started()  # the interval has passed: one run for the three
    finished()
    assert runs == [0.0, 0.4]
    erased(0.4)  # the next deletion, just after that run ended: it waits its turn too
    clock.advance(0.4)
    run_started()
    finished()
    clock.advance(1.0)
    erased(0.4)  # after a quiet interval: at once
    run_started()
    finished()
    assert runs == [0.0, 0.4, 0.8, 1.8]

    runs.clear()
    erased(30.0)
    erased(30.0)
    assert not began.wait(0.05)  # within 30 s of the last run, on a clock that does not move
    erasure.finish_compacting(db)  # type: ignore[arg-type]  # a clean stop runs it now
    assert runs == [1.8]


def older_transaction(url: str, kind: str) -> sa.Connection:
    """A transaction of another session, begun now and left open, on another table (no lock
    on data_keys for a VACUUM to wait on): a repeatable-read snapshot, or a read-committed
    transaction that holds a transaction id between statements (no snapshot then: only its
    id holds VACUUM back), or such a transaction in another database (transaction ids are
    the cluster's)."""
    conn = sa.create_engine(PG_ADMIN_URL if kind == "xid elsewhere" else url).connect()
    if kind == "snapshot":
        conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        conn.execute(sa.text("SELECT count(*) FROM models")).scalar_one()
    else:
        conn.execute(sa.text("SELECT pg_current_xact_id()")).scalar_one()
    return conn


def two_keys(db: Database) -> tuple[uuid.UUID, uuid.UUID, dict[uuid.UUID, bytes]]:
    """A key to destroy, a key to keep (the byte search's control) and their wrapped bytes."""
    with db.write() as session:
        (key_id, _), (kept_id, _) = create_keys(session, Keyring(b"k" * 32), 2)
        wrapped = dict(
            session.execute(
                sa.text("SELECT id, wrapped FROM data_keys WHERE id IN (:a, :b)"),
                {"a": key_id, "b": kept_id},
            ).all()
        )
    destroyed_in(db)  # nothing left over from earlier tests
    return key_id, kept_id, {k: bytes(v) for k, v in wrapped.items()}


@pytest.mark.parametrize("kind", ["snapshot", "xid", "xid elsewhere"])
def test_a_key_destroyed_under_an_older_transaction_still_leaves_the_files(
    pg_url: str, kind: str
) -> None:
    """VACUUM FULL keeps a deleted row that an open transaction may still see: compaction waits
    until the transactions older than it have ended, so the rewritten partition does not keep
    the destroyed key (a read, or a transaction holding an id, even in another database, began
    before the erasure)."""
    from tests.integration.test_erasure import database_bytes

    db = database(pg_url)
    key_id, kept_id, wrapped = two_keys(db)
    older = older_transaction(pg_url, kind)
    try:
        with db.write() as session:
            destroy_keys(session, [key_id])
        outcome: list[erasure.Compaction] = []
        compacting = threading.Thread(target=lambda: outcome.append(compact(db)))
        compacting.start()
        time.sleep(0.5)
        assert compacting.is_alive()  # it waits for the older transaction
    finally:
        older.rollback()
        older.close()
    compacting.join(timeout=60)
    assert not compacting.is_alive() and len(outcome) == 1
    # `kept` only while a transaction of another test process (the suite shares the server)
    # began before the erasure and outlasted the wait: then the next runs are clean once it
    # has ended, as the compaction thread's retries are (the test below)
    deadline = time.monotonic() + 120
    while outcome[-1] is erasure.Compaction.kept and time.monotonic() < deadline:
        outcome.append(compact(db))
    assert outcome[-1] is erasure.Compaction.clean, outcome
    haystack = database_bytes(pg_url)
    assert wrapped[key_id] not in haystack
    assert wrapped[kept_id] in haystack  # control: the search sees a kept key


def test_compaction_retries_while_a_transaction_older_than_the_erasure_stays_open(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that outlasts the wait: VACUUM FULL keeps the destroyed key, the run says
    so (VACUUM's own count of rows it could not remove), and the compaction thread runs again,
    backing off, for as long as that transaction lasts: the key leaves the files soon after it
    ends (it had stayed until the next erasure)."""
    from tests.integration.test_erasure import database_bytes

    monkeypatch.setattr(erasure, "SNAPSHOT_WAIT_SECONDS", 0.1)
    db = database(pg_url)
    key_id, kept_id, wrapped = two_keys(db)
    older = older_transaction(pg_url, "xid")
    try:
        with db.write() as session:
            destroy_keys(session, [key_id])
        assert compact(db) is erasure.Compaction.kept
        assert wrapped[key_id] in database_bytes(pg_url)
        assert has_destroyed(db)  # noted again for the next run
        erasure.compact_soon(db, interval=0.05)
        time.sleep(2.0)  # longer than three runs and their waits
        running = erasure.compaction_thread(db)
        assert running is not None and running.is_alive()
    finally:
        older.rollback()
        older.close()
    running.join(timeout=10)
    assert not running.is_alive() and not has_destroyed(db)
    haystack = database_bytes(pg_url)
    assert wrapped[key_id] not in haystack
    assert wrapped[kept_id] in haystack
