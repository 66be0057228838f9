"""Bulk inserts through the driver, for rows counted in millions: COPY on PostgreSQL, many
rows per statement on SQLite.

SQLAlchemy processes every parameter of every row (type processors, a dict per row); without
that was a third of a million-sample registration's time. Rows
here are tuples already in the driver's form; `driver_uuid` gives a UUID the column's form.
`insert_together` is the other kind of bulk: the few rows of several tables that one commit
writes, in one statement on PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any
from uuid import UUID

from sqlalchemy import Column, Connection, Row, Table, bindparam, func, insert, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import DBAPIError

SQLITE_PARAMETERS = 32_766  # SQLite's most parameters in one statement (since 3.32)
# Rows in one SQLite INSERT. SQLite compiles a statement's VALUES rows at about ten times what
# it then takes to run them, and the driver's cache of compiled statements serves only the
# same text again, so statements of a few hundred rows compile once and repeat (an append
# runs in a fresh upload child, where every statement is compiled anew).
SQLITE_STATEMENT_ROWS = 256


def sqlite_parameters(conn: Connection) -> int:
    """The most parameters one statement may take on this SQLite connection: its library's
    limit where the driver reports it (Python 3.11), else SQLITE_PARAMETERS."""
    driver = conn.connection.driver_connection
    getlimit = getattr(driver, "getlimit", None)
    if getlimit is None:
        return SQLITE_PARAMETERS
    return int(getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER))


def insert_rows(conn: Connection, table: Table, columns: Sequence[str], rows: list[tuple]) -> None:
    """INSERT `rows` (tuples in `columns` order) into `table`, no RETURNING: COPY on
    PostgreSQL, on SQLite statements of SQLITE_STATEMENT_ROWS rows (fewer where its parameter
    limit says so)."""
    if not rows:
        return
    unknown = [name for name in columns if name not in table.c]
    if unknown:  # refused before any SQL is built from the names
        raise KeyError(f"{table.name} has no column(s) {unknown}")
    quote = conn.dialect.identifier_preparer.quote
    names = f"{quote(table.name)} ({', '.join(quote(c) for c in columns)})"
    if conn.dialect.name == "postgresql":
        _copy(conn, f"COPY {names} FROM STDIN", rows)
        return
    head = f"INSERT INTO {names} VALUES "
    one = f"({', '.join(['?'] * len(columns))})"
    # SQLite: many rows per statement. `executemany` steps once per row and gives Python's
    # lock back at each step, so a registration's insert thread waited on the sealing thread
    # 5,000 times a chunk and the two ran no faster than one after the other; at
    # most SQLITE_STATEMENT_ROWS, so that one compiled statement serves every full batch
    per = max(1, min(SQLITE_STATEMENT_ROWS, sqlite_parameters(conn) // len(columns)))
    for start in range(0, len(rows), per):
        batch = rows[start : start + per]
        flat = tuple(chain.from_iterable(batch))
        conn.exec_driver_sql(head + ", ".join([one] * len(batch)), flat)


def _copy(conn: Connection, statement: str, rows: list[tuple]) -> None:
    """`rows` through PostgreSQL's COPY, in the caller's transaction: with the suppression
    screen's one-parameter lookups, it made a million-row registration far faster than
    `executemany`. The driver's errors come out as
    SQLAlchemy's, as a statement's would (retries, 409s)."""
    import psycopg

    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        with cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
    except psycopg.Error as exc:
        raise DBAPIError.instance(statement, None, exc, psycopg.Error) from exc


def driver_uuid(conn: Connection, value: UUID) -> Any:
    """A UUID as the driver stores it: native on PostgreSQL, 32 hex digits on SQLite (the form
    SQLAlchemy's `Uuid` type uses there)."""
    return value if conn.dialect.name == "postgresql" else value.hex


def driver_uuids(conn: Connection) -> Callable[[UUID], Any]:
    """`driver_uuid` for this connection's driver, decided once (a registration converts two
    million UUIDs)."""
    if conn.dialect.name == "postgresql":
        return lambda value: value
    return lambda value: value.hex


def insert_together(
    conn: Connection,
    parts: Sequence[tuple[Table, list[dict[str, Any]]]],
    last: tuple[Table, list[dict[str, Any]]],
    returning: Sequence[Column[Any]],
) -> list[Row[Any]]:
    """INSERT each of `parts`' rows and `last`'s, and return `returning` of `last`'s rows (in
    no particular order). The rows of one table share their keys. On PostgreSQL one
    statement, the parts as data-modifying CTEs, each table's rows sent as one array per
    column: one round trip, and a statement built once per shape (a multi-row VALUES is
    compiled anew for its values and cost more than the round trips it saved).
    Elsewhere one statement per table. The tables must not refer to one another."""
    table, rows = last
    if not rows:
        raise ValueError("insert_together needs rows to return")
    parts = [(t, r) for t, r in parts if r]
    if conn.dialect.name != "postgresql":
        for part, part_rows in parts:
            conn.execute(insert(part), part_rows)
        return list(conn.execute(insert(table).returning(*returning), rows))
    every = [*parts, last]
    shape = (
        tuple((t.name, tuple(r[0]), len(r) > 1) for t, r in every),
        tuple(str(c) for c in returning),
    )
    statement = _TOGETHER.get(shape)
    if statement is None:
        built = [_rows_in(t, tuple(r[0]), f"p{i}_", len(r) > 1) for i, (t, r) in enumerate(every)]
        ctes = [b.cte(f"part_{i}") for i, b in enumerate(built[:-1])]
        statement = _TOGETHER[shape] = built[-1].returning(*returning).add_cte(*ctes)
    params: dict[str, Any] = {}
    for i, (_, part_rows) in enumerate(every):
        for column in part_rows[0]:
            values = [row[column] for row in part_rows]
            params[f"p{i}_{column}"] = values if len(part_rows) > 1 else values[0]
    return list(conn.execute(statement, params))


_TOGETHER: dict[tuple[Any, ...], Any] = {}  # shape -> its statement (see insert_together)


def bound_values(table: Table, prefix: str, columns: Sequence[str]) -> dict[str, Any]:
    """column -> a parameter named `prefix`+column of the column's type. Prefixed: a
    parameter named after a column of the table an INSERT or UPDATE writes is added by
    SQLAlchemy to its columns."""
    return {c: bindparam(prefix + c, type_=table.c[c].type) for c in columns}


def _rows_in(table: Table, columns: tuple[str, ...], prefix: str, many: bool) -> Any:
    """INSERT into `table` of one row of parameters `prefix`+column, or (`many`) of the rows
    of as many arrays, unnested side by side (PostgreSQL)."""
    if not many:
        return insert(table).values(bound_values(table, prefix, columns))
    arrays = [func.unnest(bindparam(prefix + c, type_=ARRAY(table.c[c].type))) for c in columns]
    return insert(table).from_select(list(columns), select(*arrays))
