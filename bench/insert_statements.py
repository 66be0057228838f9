"""A registration's inserts on SQLite as one `executemany` per chunk (one statement step per
row, each giving Python's lock back) against many rows per statement (`app/db/bulk.py`),
side by side in one run, alternating: `registration.register` end to end, in process, 1,000,000
× 256 float32 from Parquet (`bench/registration_stages.py`'s `whole`), and the same with the
sealing and the inserts on one thread (`serial`: what the two-thread pipeline would take if
the two did not overlap at all).

    .venv/bin/python -m bench.insert_statements [--n 1000000] [--features 256] [--runs 2]

Writes bench/results/insert_statements.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Table

from app.services import registration
from app.storage import keystore
from bench.common import alternating, write_result
from bench.registration import parquet_bytes
from bench.registration_stages import fresh_runtime, whole


def executemany(conn: Connection, table: Table, columns: Sequence[str], rows: list[tuple]) -> None:
    """`bulk.insert_rows` as it was: one executemany, a statement step per row."""
    if not rows:
        return
    quote = conn.dialect.identifier_preparer.quote
    conn.exec_driver_sql(
        f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) "
        f"VALUES ({', '.join(['?'] * len(columns))})",
        rows,
    )


class OneThread:
    """`registration.ChunkWriter` with each commit run at once, on the caller's thread."""

    def __enter__(self) -> OneThread:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def submit(self, commit: Callable[..., None], *args: Any) -> None:
        commit(*args)


@contextlib.contextmanager
def patched(insert: Callable[..., None] | None, writer: type | None) -> Iterator[None]:
    """The registration's inserts (its rows and blocks, and the keys' rows) through `insert`
    and its chunks through `writer`, where given."""
    saved = registration.insert_rows, keystore.insert_rows, registration.ChunkWriter
    if insert is not None:
        registration.insert_rows = keystore.insert_rows = insert  # type: ignore[assignment]
    if writer is not None:
        registration.ChunkWriter = writer  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        registration.insert_rows, keystore.insert_rows, registration.ChunkWriter = saved


MODES: dict[str, tuple[Callable[..., None] | None, type | None]] = {
    "executemany": (executemany, None),
    "rows_per_statement": (None, None),
    "rows_per_statement_serial": (None, OneThread),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    data = parquet_bytes(args.n, args.features, 65536)
    took: dict[str, list[float]] = {name: [] for name in MODES}
    with tempfile.TemporaryDirectory(prefix="lethe-statements-") as scratch:
        for run, name in alternating(list(MODES), args.runs):
            runtime = fresh_runtime(Path(scratch), f"{name}-{run}", args.n, args.features)
            with patched(*MODES[name]):
                took[name].append(round(whole(runtime, data, "blocks"), 3))
            print(name, took[name][-1], flush=True)
    result = {
        "n": args.n,
        "features": args.features,
        "register_s": took,
        "register_s_median": {k: statistics.median(v) for k, v in took.items()},
    }
    write_result("insert_statements", result)
    print(result)


if __name__ == "__main__":
    main()
