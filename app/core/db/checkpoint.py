"""SQLite's WAL checkpoint after an upload, on a thread of its own, off the path of the work
that follows it.

An upload's child writes its rows with automatic checkpoints put off (`wal_autocheckpoint`,
app/core/services/registration.py), so the first commit after it, from any connection, ran the
automatic checkpoint of the whole upload, in the learning's lease write, on the path from
the POST to the learned version.
Started as soon as the child is done, this checkpoint holds SQLite's checkpointer lock while
it copies the frames, so the commits that come meanwhile skip their own (an automatic
checkpoint gives way when another one runs) and wait for nothing. PASSIVE: it waits for no
reader or writer, and what it cannot copy yet the next checkpoint copies.

A large upload also leaves the WAL file as large as its writes between checkpoints (hundreds
of MiB after a million-row registration): SQLite reuses the file and does not shrink it. The
first erasure's compaction truncated it (`wal_checkpoint(TRUNCATE)`, app/core/storage/erasure.py),
freeing its pages with new writers held off, right after the first deletion was announced,
which the first append after it waited for.
So a WAL file left larger than `WAL_KEPT_BYTES` is truncated here, by a TRUNCATE that waits
for no one (busy timeout 0): if a reader or writer is in the way, the next one does it."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from sqlalchemy import Engine

from app.core.db.session import SQLITE_BUSY_MS, Database

log = logging.getLogger("lethe.checkpoint")

WAL_KEPT_BYTES = 64 * 2**20  # a WAL file left larger after an upload is truncated


def checkpoint_behind(db: Database) -> threading.Thread | None:
    """Start a PASSIVE WAL checkpoint of `db` on a daemon thread, and a truncate of a WAL file
    left large (SQLite; None elsewhere): the thread, for whoever wants to wait for it."""
    if db.engine.dialect.name != "sqlite":
        return None
    thread = threading.Thread(
        target=_checkpoint, args=(db.engine,), name="lethe-checkpoint", daemon=True
    )
    thread.start()
    return thread


def _checkpoint(engine: Engine) -> None:
    """One PASSIVE checkpoint on a raw connection (no BEGIN around the pragma), then the WAL
    file truncated if it is larger than `WAL_KEPT_BYTES`; a failure is logged: the next
    automatic checkpoint copies the frames instead, the next erasure truncates."""
    try:
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            if _wal_bytes(engine) > WAL_KEPT_BYTES:
                cursor.execute("PRAGMA busy_timeout=0")
                try:
                    busy, _, _ = cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                finally:
                    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
                if busy:
                    log.info("the WAL was in use; the next erasure's compaction truncates it")
            cursor.close()
        finally:
            raw.close()
    except Exception:
        log.warning("a WAL checkpoint after an upload failed", exc_info=True)


def _wal_bytes(engine: Engine) -> int:
    """The size of the database's WAL file (0 if there is none)."""
    wal = Path(f"{engine.url.database}-wal")
    return wal.stat().st_size if wal.exists() else 0
