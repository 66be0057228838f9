"""Appended rows' tokens move from the small recent tables into the main indexes, off the
request path.

Keyed tokens are random: 10,000 of an append's inserted straight into a million-row
`sample_tokens` touched most of its pages (tens of MB through SQLite's WAL, on the append's
POST), against a few MB into the recent table. A
merge pays that once for many appends, when no append, registration or learning runs.

A batch moves in one transaction: its rows deleted from the recent table (RETURNING them)
and inserted into the main one, so a token is in exactly one table at every commit, and a
reader that reads both in one statement sees it once. A batch leaves out every dataset with
an append under way, in the same statement: that append's duplicate check read the tables
before, and a token it did not see moved to the main table would no longer meet its own
insert in the recent table's key (the check that two racing appends of one id fail on).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby

from sqlalchemy import Table, delete, func, select, union_all
from sqlalchemy.orm import Session

from app.core.db.bulk import insert_rows
from app.core.db.session import Database
from app.core.db.tables import Dataset, DatasetAppend, LearnTask
from app.core.services import sample_tokens, subject_tokens
from app.core.services.registration import APPEND_CACHE_KIB
from app.core.states import DatasetStatus, TaskStatus

log = logging.getLogger("lethe.token_merge")

# (recent table, main table): the same columns and primary key
PAIRS: tuple[tuple[Table, Table], ...] = (
    (sample_tokens.RECENT, sample_tokens.TOKENS),
    (subject_tokens.RECENT, subject_tokens.SUBJECTS),
)
COLUMNS = ("dataset_id", "token", "sample_id")
# Keys a transaction moves: consecutive in token order, so their main-table pages are near
# one another, and the write lock is held briefly (a transaction's wait is what a deletion
# arriving then can wait).
BATCH = 2_000
HARD_FACTOR = 4  # at this many times the threshold a merge no longer waits for quiet


def waiting(session: Session) -> int:
    """How many tokens the recent tables hold."""
    counts = (select(func.count()).select_from(recent) for recent, _ in PAIRS)
    return sum(int(n) for n in session.scalars(union_all(*counts)))


def busy(session: Session) -> bool:
    """Whether an append or a registration is writing, or a learning is queued or running:
    the work a merge's writes would slow (an append's POST, its learned version)."""
    appending = select(DatasetAppend.id).where(DatasetAppend.status == DatasetStatus.registering)
    registering = select(Dataset.id).where(Dataset.status == DatasetStatus.registering)
    learning = select(LearnTask.id).where(
        LearnTask.status.in_((TaskStatus.queued, TaskStatus.running))
    )
    return any(session.scalar(q.limit(1)) is not None for q in (appending, registering, learning))


def move_batch(session: Session, recent: Table, main: Table, batch: int = BATCH) -> int:
    """Up to `batch` keys' rows from `recent` into `main`, in the caller's transaction, none
    of a dataset with an append under way; how many rows moved."""
    conn = session.connection()
    if conn.dialect.name == "sqlite":  # the main index's pages, held (as an append's writer)
        conn.exec_driver_sql(f"PRAGMA cache_size=-{APPEND_CACHE_KIB}")
    appending = select(DatasetAppend.dataset_id).where(
        DatasetAppend.status == DatasetStatus.registering
    )
    keys = session.execute(
        select(recent.c.dataset_id, recent.c.token)
        .where(recent.c.dataset_id.not_in(appending))
        .order_by(recent.c.dataset_id, recent.c.token)
        .limit(batch)
    ).all()
    moved = 0
    for dataset_id, named in groupby(keys, key=lambda k: k[0]):
        tokens: Sequence[str] = sorted({t for _, t in named})
        rows = session.execute(
            delete(recent)
            .where(
                recent.c.dataset_id == dataset_id,
                recent.c.token.in_(tokens),
                recent.c.dataset_id.not_in(appending),
            )
            .returning(recent.c.dataset_id, recent.c.token, recent.c.sample_id)
        ).all()
        insert_rows(conn, main, COLUMNS, sorted(tuple(r) for r in rows))
        moved += len(rows)
    return moved


@dataclass(frozen=True)
class Merged:
    """What a merge did: tokens moved, its seconds, its longest transaction's (how long it
    held the write lock from a deletion on SQLite)."""

    moved: int = 0
    seconds: float = 0.0
    longest_s: float = 0.0


def merge(db: Database, threshold: int) -> Merged:
    """Move the recent tokens into the main tables once they number `threshold`, while
    nothing is `busy` (checked before each batch: a merge gives way to an append that
    begins), or at `HARD_FACTOR` times it regardless."""
    with db.read() as session:
        found = waiting(session)
        if found < threshold or (found < HARD_FACTOR * threshold and busy(session)):
            return Merged()
    began, moved, longest = time.perf_counter(), 0, 0.0
    for recent, main in PAIRS:
        step = -1
        while step != 0:
            start = time.perf_counter()
            # not durable: a move a crash loses leaves the tokens in the recent table
            with db.write(durable=False) as session:
                if found < HARD_FACTOR * threshold and busy(session):
                    log.info("token merge: %d moved, stopped for other work", moved)
                    return Merged(moved, time.perf_counter() - began, longest)
                step = move_batch(session, recent, main)
            longest = max(longest, time.perf_counter() - start)
            moved += step
    done = Merged(moved, time.perf_counter() - began, longest)
    log.info(
        "token merge: %d moved in %.3f s (longest transaction %.3f s)",
        done.moved,
        done.seconds,
        done.longest_s,
    )
    return done
