"""The `sample_tokens` table: (dataset, keyed id token) → sample, the lookup from a client's id
to its row and the rule that an id is held once per dataset.

A registration writes its rows in file order and its tokens last, sorted (`SortedTokens`):
keyed tokens are random, and a unique index of them filled row by row wrote each row to a
random page of the index. An append's rows write theirs with them
into `sample_tokens_recent` (`insert_new`), a small table that `app/core/services/token_merge.py`
empties into the main one off the request path: a token is in one of the two, and every
reader here reads both. Whoever deletes samples deletes their tokens (`delete_tokens`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from typing import IO

import numpy as np
from sqlalchemy import CompoundSelect, Connection, Table, delete, func, select, union_all
from sqlalchemy.orm import Session

from app.core.db.bulk import insert_rows
from app.core.db.chunks import CHUNK, chunked
from app.core.db.tables import Base
from app.core.storage.crypto import TOKEN_PREFIX

SAMPLES, TOKENS = Base.metadata.tables["samples"], Base.metadata.tables["sample_tokens"]
RECENT = Base.metadata.tables["sample_tokens_recent"]
BOTH = (RECENT, TOKENS)  # the order a deleter takes them in (app/core/services/token_merge.py)
COLUMNS = ("dataset_id", "token", "sample_id")
TOKEN_CHARS = 32  # a keyed token's base64 of 24 bytes (`Keyring.token`), after its prefix
TOKEN_LENGTH = len(TOKEN_PREFIX) + TOKEN_CHARS


def last_sample_id(conn: Connection) -> int:
    """The largest sample id so far: the rows a transaction then inserts have larger ones
    (SQLite gives max + 1; a PostgreSQL sequence only grows)."""
    return int(conn.execute(select(func.coalesce(func.max(SAMPLES.c.id), 0))).scalar_one())


def inserted_ids(
    conn: Connection, dataset_id: int, after: int, count: int, append_id: int | None = None
) -> list[int]:
    """The ids of the `count` rows this transaction just inserted into the dataset (for
    `append_id`, or with the dataset's registration: None), all above `after`, in id order:
    the order they were inserted in. On SQLite, whose write lock makes this transaction the
    only writer, they are every id above `after`: counted and bounded there, not read back
    (reading a million rows' ids back held the inserting thread). On PostgreSQL the
    primary key's range above `after` is read and the dataset and append checked here (with
    the dataset in the query, SQLite walked its index: every row so far at each chunk); the
    append keeps out the rows another append to the dataset committed meanwhile."""
    if conn.dialect.name == "sqlite":  # one writer at a time: every id above `after` is ours
        found, low, high = conn.execute(
            select(func.count(), func.min(SAMPLES.c.id), func.max(SAMPLES.c.id)).where(
                SAMPLES.c.id > after
            )
        ).one()
        if found == count and (count == 0 or high - low + 1 == count):
            return list(range(low, high + 1)) if count else []
        raise RuntimeError(f"{count} rows inserted, {found} found after id {after}")
    newer = select(SAMPLES.c.id, SAMPLES.c.dataset_id, SAMPLES.c.append_id)
    rows = conn.execute(newer.where(SAMPLES.c.id > after).order_by(SAMPLES.c.id))
    ids = [i for i, d, a in rows if d == dataset_id and a == append_id]
    if len(ids) != count:
        raise RuntimeError(f"{count} rows inserted, {len(ids)} found after id {after}")
    return ids


def insert_new(
    conn: Connection, dataset_id: int, tokens: Sequence[str], ids: Sequence[int]
) -> None:
    """The tokens of rows just appended (a chunk: `inserted_ids`), into the recent table. A
    token the dataset holds already fails the commit: the recent table's primary key, or,
    for one merged meanwhile, `token_merge`'s leaving a dataset with an append under way."""
    rows = [(dataset_id, t, i) for t, i in zip(tokens, ids, strict=True)]
    insert_rows(conn, RECENT, COLUMNS, rows)


class SortedTokens:
    """A registration's (token, sample id) pairs, gathered a chunk at a time as its rows
    commit and written last in token order (`chunks`). Each pair is 36 bytes (the token's
    32 characters after its prefix, the id's offset from the first as 4 bytes), spilled as it
    comes into one unlinked temporary file per first character of the token and sorted a
    file at a time at the end: a million rows held in memory were 36 MB an index, over a
    registration child's memory bound with a subject column. The tokens
    are keyed (no id in them), and the files vanish with the process however it ends."""

    RECORD = np.dtype([("token", f"S{TOKEN_CHARS}"), ("offset", "<u4")])

    def __init__(self) -> None:
        self._files: dict[int, IO[bytes]] = {}  # first byte of the token -> its pairs
        self._open = ExitStack()
        self._first: int | None = None
        self._count = 0

    def add(self, tokens: Sequence[str], ids: Sequence[int]) -> None:
        """A committed chunk's tokens and its rows' ids, in the same order."""
        if len(tokens) != len(ids):
            raise ValueError(f"{len(tokens)} tokens for {len(ids)} ids")
        if not ids:
            return
        if any(not t.startswith(TOKEN_PREFIX) or len(t) != TOKEN_LENGTH for t in tokens):
            raise ValueError("a token not of the keyring's form")
        first = ids[0] if self._first is None else self._first
        offsets = np.asarray(ids, dtype=np.int64) - first
        if offsets.min() < 0 or offsets.max() >= 2**32:
            raise ValueError("sample ids out of the registration's range")
        self._first = first
        records = np.empty(len(ids), self.RECORD)
        records["token"] = [t[len(TOKEN_PREFIX) :] for t in tokens]
        records["offset"] = offsets
        heads = records["token"].astype(f"S{TOKEN_CHARS}").view(np.uint8)[::TOKEN_CHARS]
        order = np.argsort(heads, kind="stable")
        records, heads = records[order], heads[order]
        values, starts = np.unique(heads, return_index=True)
        for value, lo, hi in zip(values, starts, [*starts[1:], len(heads)], strict=True):
            self._file(int(value)).write(records[lo:hi].tobytes())
        self._count += len(ids)

    def _file(self, head: int) -> IO[bytes]:
        if head not in self._files:
            spill = tempfile.TemporaryFile(prefix="lethe-tokens-")  # noqa: SIM115 (closed by close)
            self._files[head] = self._open.enter_context(spill)
        return self._files[head]

    def __len__(self) -> int:
        return self._count

    def chunks(self, size: int) -> Iterator[list[tuple[str, int]]]:
        """(token, sample id) in the database's order of the tokens (ASCII: the order of
        their bytes), a list of at most `size` at a time."""
        for head in sorted(self._files):
            spilled = self._files[head]
            spilled.seek(0)
            records = np.frombuffer(spilled.read(), self.RECORD)
            records = records[np.argsort(records["token"], kind="stable")]
            for start in range(0, len(records), size):
                part = records[start : start + size]
                ids = part["offset"].astype(np.int64) + (self._first or 0)  # past 2**32 too
                pairs = zip(part["token"].tolist(), ids.tolist(), strict=True)
                yield [(TOKEN_PREFIX + t.decode(), i) for t, i in pairs]

    def close(self) -> None:
        """The temporary files closed (and so gone)."""
        self._open.close()
        self._files.clear()

    def __enter__(self) -> SortedTokens:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def insert_sorted(conn: Connection, dataset_id: int, pairs: list[tuple[str, int]]) -> None:
    """One chunk of `SortedTokens.chunks` into the main table (a registration's)."""
    insert_rows(conn, TOKENS, COLUMNS, [(dataset_id, t, i) for t, i in pairs])


def ids_by_token(tables: Sequence[Table], dataset_id: int, tokens: Sequence[str]) -> CompoundSelect:
    """The sample ids these token tables (a main one and its recent one) give for `tokens`
    in the dataset."""
    return union_all(
        *(
            select(t.c.sample_id).where(t.c.dataset_id == dataset_id, t.c.token.in_(tokens))
            for t in tables
        )
    )


def samples_named(dataset_id: int, tokens: Sequence[str]) -> CompoundSelect:
    """The ids of the dataset's samples whose tokens are `tokens` (in either table)."""
    return ids_by_token(BOTH, dataset_id, tokens)


# Which of a list of tokens a dataset holds, in either table, as the driver takes it: built
# by SQLAlchemy, its expanding IN list was rendered and bound per table and chunk, which cost
# more than the check itself.
_HELD = {
    "sqlite": "SELECT token FROM {t} WHERE dataset_id = ? AND token IN ({marks})",
    "postgresql": "SELECT token FROM {t} WHERE dataset_id = %s AND token = ANY(%s)",
}
# Tokens per statement: PostgreSQL takes them as one array; SQLite's IN lists of 500 were
# faster than lists of 5,000.
_HELD_CHUNK = {"sqlite": 500, "postgresql": CHUNK}


def held(session: Session, dataset_id: int, tokens: Sequence[str]) -> set[str]:
    """Which of `tokens` the dataset holds (erased samples' included), in either table: one
    statement a chunk, so a merge's move between the tables is seen whole or not at all."""
    conn = session.connection()
    dialect = conn.dialect.name
    found: set[str] = set()
    for chunk in chunked(sorted(set(tokens)), _HELD_CHUNK[dialect]):
        one = _HELD[dialect].format(t="{t}", marks=", ".join("?" * len(chunk)))
        statement = " UNION ALL ".join(one.format(t=t.name) for t in BOTH)
        per_table = (dataset_id, *chunk) if dialect == "sqlite" else (dataset_id, chunk)
        found.update(t for (t,) in conn.exec_driver_sql(statement, per_table * len(BOTH)))
    return found


def delete_tokens(session: Session, dataset_id: int, tokens: Sequence[str]) -> None:
    """The tokens of samples being deleted, from the recent table first: on PostgreSQL a
    merge moving them holds their recent rows, so this waits for it and then finds them in
    the main table."""
    for table in BOTH:
        for chunk in chunked(list(tokens)):
            session.execute(
                delete(table).where(table.c.dataset_id == dataset_id, table.c.token.in_(chunk))
            )
