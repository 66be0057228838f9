"""How a commit's inserts into several tables reach PostgreSQL (issue 28, goal 3).

The log's append (`app.ledger.certificates.append_certificates`: the certificates, the new
nodes of both Merkle trees and the signed head) on a fresh PostgreSQL database with a few
hundred certificates, in one process, three ways interleaved append by append, so that the
machine's drift falls on all three alike: `separate`, one statement per table (what SQLite
runs); `values`, one statement of data-modifying CTEs with multi-row VALUES (compiled anew
for its values); `arrays`, `app.db.bulk.insert_together` (one statement, each table's rows as
one array per column, built once per shape). Each append runs in a transaction that is rolled
back, so every round appends at the same size. Reports the median milliseconds per append
for batches of 1 and of 100 certificates.

    .venv/bin/python -m bench.insert_together [--rounds 300] [--out insert_together]

Writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Column, Connection, Table, insert
from sqlalchemy.orm import Session

from app.db import bulk
from app.db.session import database
from app.ledger import certificates as audit
from bench.common import scratch_database, write_result
from bench.transparency import fields

Rows = tuple[Table, list[dict[str, Any]]]
Parts = Sequence[Rows]
Insert = Callable[[Connection, Parts, Rows, Sequence[Column[Any]]], Any]


def separate(conn: Connection, parts: Parts, last: Rows, returning: Any) -> list[Any]:
    """One statement per table, in order (the SQLite path of insert_together)."""
    for table, rows in parts:
        if rows:
            conn.execute(insert(table), rows)
    table, rows = last
    return list(conn.execute(insert(table).returning(*returning), rows))


def values(conn: Connection, parts: Parts, last: Rows, returning: Any) -> list[Any]:
    """One statement: the parts as CTEs of multi-row VALUES, the last one returning."""
    table, rows = last
    ctes = [insert(t).values(r).cte(f"part_{i}") for i, (t, r) in enumerate(parts) if r]
    return list(conn.execute(insert(table).values(rows).returning(*returning).add_cte(*ctes)))


WAYS: dict[str, Insert] = {
    "separate": separate,
    "values": values,
    "arrays": bulk.insert_together,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--out", default="insert_together")
    args = parser.parse_args()
    signer = Ed25519PrivateKey.generate()
    result: dict[str, Any] = {"rounds": args.rounds}
    with scratch_database() as url:
        db = database(url)
        for b in range(300):  # a log of some size first
            with db.write() as session:
                audit.append_certificates(session, [fields(b)], signer)
        for batch in (1, 100):
            times: dict[str, list[float]] = {name: [] for name in WAYS}
            for r in range(args.rounds):
                for name, way in WAYS.items():
                    audit.insert_together = way  # type: ignore[assignment]
                    with db.engine.connect() as conn, Session(bind=conn) as session:
                        session.begin()
                        batch_fields = [fields(10_000 + r * batch + i) for i in range(batch)]
                        start = time.perf_counter()
                        audit.append_certificates(session, batch_fields, signer)
                        times[name].append(time.perf_counter() - start)
                        session.rollback()
            audit.insert_together = bulk.insert_together
            warm = args.rounds // 10  # statement caches and connections warm
            result[f"batch_{batch}"] = {
                name: {"median_ms": 1000 * statistics.median(t[warm:]), "appends": len(t) - warm}
                for name, t in times.items()
            }
        db.engine.dispose()
    for key in ("batch_1", "batch_100"):
        print(key, {k: round(v["median_ms"], 2) for k, v in result[key].items()})
    write_result(args.out, result)


if __name__ == "__main__":
    main()
