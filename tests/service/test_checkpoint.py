"""The WAL checkpoint after an upload (app/core/db/checkpoint.py): it copies what the upload left in
SQLite's WAL, so the next commit (the learning's lease) does not run that checkpoint itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.core.db import checkpoint
from app.core.db.checkpoint import checkpoint_behind
from app.core.db.session import SQLITE_BUSY_MS, database


def test_an_upload_s_wal_is_checkpointed_behind_it(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    db = database(f"sqlite:///{path}")
    with sqlite3.connect(path) as writer:  # an upload's child: automatic checkpoints put off
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("CREATE TABLE rows (data BLOB)")
        writer.executemany("INSERT INTO rows VALUES (?)", [(bytes(4096),)] * 500)
        writer.commit()
        assert path.stat().st_size < 500 * 4096  # the rows wait in the WAL
        thread = checkpoint_behind(db)
        assert thread is not None
        thread.join(timeout=30)
        assert path.stat().st_size > 500 * 4096  # copied into the database file
    db.dispose()


def test_no_thread_for_postgres(pg_url: str) -> None:
    assert checkpoint_behind(database(pg_url)) is None


def _upload_s_wal(path: Path) -> sqlite3.Connection:
    """A WAL left by an upload's child: 500 pages written with automatic checkpoints off."""
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE rows (data BLOB)")
    writer.executemany("INSERT INTO rows VALUES (?)", [(bytes(4096),)] * 500)
    writer.commit()
    return writer


def test_a_large_wal_file_is_truncated_behind_an_upload(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, wal = tmp_path / "x.db", tmp_path / "x.db-wal"
    monkeypatch.setattr(checkpoint, "WAL_KEPT_BYTES", 100 * 4096)
    db = database(f"sqlite:///{path}")
    with _upload_s_wal(path):
        assert wal.stat().st_size > 500 * 4096
        thread = checkpoint_behind(db)
        assert thread is not None
        thread.join(timeout=30)
        assert wal.stat().st_size == 0  # its pages freed now, not by the first erasure
        assert db.engine.pool.checkedin() == 1  # the thread's connection, back in the pool
        raw = db.engine.raw_connection()  # it waits for locks again
        try:
            assert raw.cursor().execute("PRAGMA busy_timeout").fetchone() == (SQLITE_BUSY_MS,)
        finally:
            raw.close()
    db.dispose()


def test_the_truncate_waits_for_no_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, wal = tmp_path / "x.db", tmp_path / "x.db-wal"
    monkeypatch.setattr(checkpoint, "WAL_KEPT_BYTES", 100 * 4096)
    db = database(f"sqlite:///{path}")
    with _upload_s_wal(path) as writer, sqlite3.connect(path) as reader:
        reader.execute("BEGIN")
        assert reader.execute("SELECT count(*) FROM rows").fetchone() == (500,)  # a snapshot
        writer.execute("INSERT INTO rows VALUES (x'00')")  # newer than the reader's
        writer.commit()
        thread = checkpoint_behind(db)
        assert thread is not None
        # with the engine's busy timeout (30 s) the TRUNCATE would wait for the reader here
        thread.join(timeout=10)
        assert not thread.is_alive()
        assert wal.stat().st_size > 500 * 4096  # left for the next erasure's compaction
        reader.rollback()
    db.dispose()
