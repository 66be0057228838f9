"""The `subject_tokens` table: (dataset, keyed subject token, sample), the lookup from a
client's subject to its rows (issue 55, goal 6). Like `sample_tokens`: a registration writes
them last, sorted (`sample_tokens.SortedTokens`), because keyed tokens are random and an index
of them filled row by row wrote each row to a random page; an append's few rows write theirs
with them. Whoever deletes samples deletes their subject tokens (`delete_of`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Select, delete, select
from sqlalchemy.orm import Session

from app.db.bulk import insert_rows
from app.db.chunks import chunked
from app.db.tables import Base

SUBJECTS = Base.metadata.tables["subject_tokens"]
COLUMNS = ("dataset_id", "token", "sample_id")


def pairs_of(tokens: Sequence[str | None], ids: Sequence[int]) -> list[tuple[str, int]]:
    """(subject token, sample id) of the rows that name a subject, in row order."""
    return [(t, i) for t, i in zip(tokens, ids, strict=True) if t is not None]


def insert(conn: Connection, dataset_id: int, pairs: Iterable[tuple[str, int]]) -> None:
    """(token, sample id) pairs into the table (a registration's in token order)."""
    insert_rows(conn, SUBJECTS, COLUMNS, [(dataset_id, t, i) for t, i in pairs])


def samples_of(dataset_id: int, tokens: Sequence[str]) -> Select[Any]:
    """The ids of the dataset's samples whose subject tokens are `tokens`."""
    return select(SUBJECTS.c.sample_id).where(
        SUBJECTS.c.dataset_id == dataset_id, SUBJECTS.c.token.in_(tokens)
    )


def delete_of(session: Session, dataset_id: int, rows: Sequence[tuple[str | None, int]]) -> None:
    """The subject tokens of these samples ((subject token or None, sample id)), which are
    being deleted."""
    named = [(t, i) for t, i in rows if t is not None]
    for chunk in chunked(named):
        # a sample has one subject token: a row with a token and a sample both listed is one
        # of these pairs (the primary key finds the tokens' rows; no index on the sample)
        session.execute(
            delete(SUBJECTS).where(
                SUBJECTS.c.dataset_id == dataset_id,
                SUBJECTS.c.token.in_(sorted({t for t, _ in chunk})),
                SUBJECTS.c.sample_id.in_([i for _, i in chunk]),
            )
        )
