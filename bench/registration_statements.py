"""A registration's statements as they were and as they are, on SQLite and on PostgreSQL,
side by side in one run, alternating (issue 55, goal 6): `registration.register` end to end,
in process, 1,000,000 × 256 float32 from Parquet with client ids and a subject per two rows,
against a list of 10,000 erased subjects and 10,000 samples (`bench/screening.py`'s upload).

- `before`: the suppression screen's lookups as an `IN` of up to 7,500 parameters per chunk,
  and on PostgreSQL the rows, blocks and keys inserted by `executemany`;
- `now`: the screen's tokens as one parameter (an array on PostgreSQL, a JSON array read by
  `json_each` on SQLite), and on PostgreSQL the inserts as `COPY … FROM STDIN`.

Each PostgreSQL run gets a database of its own on the local server, dropped after it.

    .venv/bin/python -m bench.registration_statements [--n 1000000] [--runs 2]

Writes bench/results/registration_statements.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from sqlalchemy import Connection, Table, select
from sqlalchemy.orm import Session

from app.db import bulk
from app.db.chunks import chunked
from app.db.migrate import upgrade_to_head
from app.db.tables import Suppression
from app.runtime import Runtime
from app.services import registration, suppression
from app.settings import Settings
from app.storage import keystore, sample_blocks
from bench.common import alternating, scratch_database, write_result
from bench.screening import listed, people_parquet, register

FEATURES = 256


def active_in(session: Session, tokens: list[str]) -> set[str]:
    """`suppression.active` as it was: an expanded `IN` per 5,000 tokens."""
    found: set[str] = set()
    for chunk in chunked(sorted(set(tokens))):
        found.update(
            session.scalars(
                select(Suppression.token).where(
                    Suppression.token.in_(chunk), Suppression.lifted_at.is_(None)
                )
            )
        )
    return found


def insert_executemany(
    conn: Connection, table: Table, columns: Sequence[str], rows: list[tuple]
) -> None:
    """`bulk.insert_rows` as it was on PostgreSQL: one executemany."""
    if conn.dialect.name != "postgresql":
        bulk.insert_rows(conn, table, columns, rows)
        return
    if rows:
        quote = conn.dialect.identifier_preparer.quote
        conn.exec_driver_sql(
            f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))})",
            rows,
        )


@contextlib.contextmanager
def before() -> Iterator[None]:
    saved = (suppression.active, registration.insert_rows, keystore.insert_rows,
             sample_blocks.insert_rows)  # fmt: skip
    suppression.active = active_in
    registration.insert_rows = keystore.insert_rows = insert_executemany
    sample_blocks.insert_rows = insert_executemany
    try:
        yield
    finally:
        (suppression.active, registration.insert_rows, keystore.insert_rows,
         sample_blocks.insert_rows) = saved  # fmt: skip


MODES: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "before": before,
    "now": contextlib.nullcontext,
}


@contextlib.contextmanager
def database(kind: str, root: Path, n: int) -> Iterator[Runtime]:
    """A fresh, migrated database of `kind` and a runtime on it."""
    with contextlib.ExitStack() as stack:
        url = None
        if kind == "postgres":
            url = stack.enter_context(scratch_database("lethe_bench_statements", migrate=False))
        settings = Settings(data_dir=root, database_url=url, max_dataset_cells=n * FEATURES,
                            max_dataset_samples=n)  # fmt: skip
        upgrade_to_head(settings.resolved_database_url, settings)
        yield Runtime.build(settings)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    data = people_parquet(args.n, FEATURES)
    took: dict[str, dict[str, list[float]]] = {
        kind: {mode: [] for mode in MODES} for kind in ("sqlite", "postgres")
    }
    with tempfile.TemporaryDirectory(prefix="lethe-statements-") as scratch:
        for run, mode in alternating(list(MODES), args.runs):
            for kind in took:
                root = Path(scratch) / f"{kind}-{mode}-{run}"
                with database(kind, root, args.n) as runtime, MODES[mode]():
                    listed(runtime, 10_000)
                    took[kind][mode].append(round(register(runtime, data), 3))
                print(kind, mode, took[kind][mode][-1], flush=True)
    result = {
        "n": args.n,
        "features": FEATURES,
        "register_s": took,
        "register_s_median": {
            kind: {mode: statistics.median(v) for mode, v in modes.items()}
            for kind, modes in took.items()
        },
    }
    write_result("registration_statements", result)
    print(result)


if __name__ == "__main__":
    main()
