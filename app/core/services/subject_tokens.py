"""The `subject_tokens` table: (dataset, keyed subject token, sample), the lookup from a
client's subject to its rows. Like `sample_tokens`: a registration writes
them last, sorted (`sample_tokens.SortedTokens`), because keyed tokens are random and an index
of them filled row by row wrote each row to a random page; an append's rows write theirs with
them into `subject_tokens_recent` (`insert_new`), which `app/core/services/token_merge.py` empties
into the main table off the request path; every reader here reads both. Whoever deletes
samples deletes their subject tokens (`delete_of`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import CompoundSelect, Connection, delete
from sqlalchemy.orm import Session

from app.core.db.bulk import insert_rows
from app.core.db.chunks import chunked
from app.core.db.tables import Base
from app.core.services.sample_tokens import ids_by_token

SUBJECTS = Base.metadata.tables["subject_tokens"]
RECENT = Base.metadata.tables["subject_tokens_recent"]
BOTH = (RECENT, SUBJECTS)  # the order a deleter takes them in (as `sample_tokens.BOTH`)
COLUMNS = ("dataset_id", "token", "sample_id")


def pairs_of(tokens: Sequence[str | None], ids: Sequence[int]) -> list[tuple[str, int]]:
    """(subject token, sample id) of the rows that name a subject, in row order."""
    return [(t, i) for t, i in zip(tokens, ids, strict=True) if t is not None]


def insert(conn: Connection, dataset_id: int, pairs: Iterable[tuple[str, int]]) -> None:
    """(token, sample id) pairs into the main table (a registration's, in token order)."""
    insert_rows(conn, SUBJECTS, COLUMNS, [(dataset_id, t, i) for t, i in pairs])


def insert_new(conn: Connection, dataset_id: int, pairs: Iterable[tuple[str, int]]) -> None:
    """An append's (token, sample id) pairs into the recent table."""
    insert_rows(conn, RECENT, COLUMNS, [(dataset_id, t, i) for t, i in pairs])


def samples_of(dataset_id: int, tokens: Sequence[str]) -> CompoundSelect:
    """The ids of the dataset's samples whose subject tokens are `tokens` (either table)."""
    return ids_by_token(BOTH, dataset_id, tokens)


def delete_of(session: Session, dataset_id: int, rows: Sequence[tuple[str | None, int]]) -> None:
    """The subject tokens of these samples ((subject token or None, sample id)), which are
    being deleted."""
    named = [(t, i) for t, i in rows if t is not None]
    for table in BOTH:  # the recent one first, as `sample_tokens.delete_tokens`
        for chunk in chunked(named):
            # a sample has one subject token: a row with a token and a sample both listed is
            # one of these pairs (the primary key finds the tokens' rows; no sample index)
            session.execute(
                delete(table).where(
                    table.c.dataset_id == dataset_id,
                    table.c.token.in_(sorted({t for t, _ in chunk})),
                    table.c.sample_id.in_([i for _, i in chunk]),
                )
            )
