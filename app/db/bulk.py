"""Bulk inserts through the driver's `executemany`, for rows counted in millions.

SQLAlchemy processes every parameter of every row (type processors, a dict per row); without
that a million-sample registration took 123 s instead of 174 s (issue 28, same sitting). Rows
here are tuples already in the driver's form; `driver_uuid` gives a UUID the column's form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from sqlalchemy import Column, Connection, Row, Table, insert


def insert_rows(conn: Connection, table: Table, columns: Sequence[str], rows: list[tuple]) -> None:
    """INSERT `rows` (tuples in `columns` order) into `table`: one executemany, no RETURNING."""
    if not rows:
        return
    unknown = [name for name in columns if name not in table.c]
    if unknown:  # refused before any SQL is built from the names
        raise KeyError(f"{table.name} has no column(s) {unknown}")
    quote = conn.dialect.identifier_preparer.quote
    marker = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    conn.exec_driver_sql(
        f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
        f"VALUES ({', '.join([marker] * len(columns))})",
        rows,
    )


def driver_uuid(conn: Connection, value: UUID) -> Any:
    """A UUID as the driver stores it: native on PostgreSQL, 32 hex digits on SQLite (the form
    SQLAlchemy's `Uuid` type uses there)."""
    return value if conn.dialect.name == "postgresql" else value.hex


def insert_together(
    conn: Connection,
    parts: Sequence[tuple[Table, list[dict[str, Any]]]],
    last: tuple[Table, list[dict[str, Any]]],
    returning: Sequence[Column[Any]],
) -> list[Row[Any]]:
    """INSERT each of `parts`' rows and `last`'s, and return `returning` of `last`'s rows (in
    no particular order). On PostgreSQL one statement, the parts as data-modifying CTEs
    (one round trip: every statement of a commit is on the path to a certificate, issue 28);
    elsewhere one statement per table. The tables must not refer to one another."""
    table, rows = last
    if not rows:
        raise ValueError("insert_together needs rows to return")
    parts = [(t, r) for t, r in parts if r]
    if conn.dialect.name != "postgresql":
        for part, part_rows in parts:
            conn.execute(insert(part), part_rows)
        return list(conn.execute(insert(table).returning(*returning), rows))
    statement = insert(table).values(rows).returning(*returning)
    ctes = [insert(t).values(r).cte(f"part_{i}") for i, (t, r) in enumerate(parts)]
    return list(conn.execute(statement.add_cte(*ctes) if ctes else statement))
