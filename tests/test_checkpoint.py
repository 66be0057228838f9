"""The WAL checkpoint after an upload (app/db/checkpoint.py): it copies what the upload left in
SQLite's WAL, so the next commit (the learning's lease) does not run that checkpoint itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from app.db.checkpoint import checkpoint_behind
from app.db.session import database


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
