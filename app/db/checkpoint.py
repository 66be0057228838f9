"""SQLite's WAL checkpoint after an upload, on a thread of its own, off the path of the work
that follows it.

An upload's child writes its rows with automatic checkpoints put off (`wal_autocheckpoint`,
app/services/registration.py), so the first commit after it, from any connection, ran the
automatic checkpoint of the whole upload: 30 MB of WAL for a 10,000-row append, 64-100 ms
of the learning's lease write, on the path from the POST to the learned version (issue 55).
Started as soon as the child is done, this checkpoint holds SQLite's checkpointer lock while
it copies the frames, so the commits that come meanwhile skip their own (an automatic
checkpoint gives way when another one runs) and wait for nothing. PASSIVE: it waits for no
reader or writer, and what it cannot copy yet the next checkpoint copies."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine

from app.db.session import Database

log = logging.getLogger("lethe.checkpoint")


def checkpoint_behind(db: Database) -> threading.Thread | None:
    """Start a PASSIVE WAL checkpoint of `db` on a daemon thread (SQLite; None elsewhere):
    the thread, for whoever wants to wait for it."""
    if db.engine.dialect.name != "sqlite":
        return None
    thread = threading.Thread(
        target=_checkpoint, args=(db.engine,), name="lethe-checkpoint", daemon=True
    )
    thread.start()
    return thread


def _checkpoint(engine: Engine) -> None:
    """One PASSIVE checkpoint on a raw connection (no BEGIN around the pragma); a failure is
    logged: the next automatic checkpoint copies the frames instead."""
    try:
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            cursor.close()
        finally:
            raw.close()
    except Exception:
        log.warning("a WAL checkpoint after an upload failed", exc_info=True)
