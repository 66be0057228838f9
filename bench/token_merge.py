"""What an append's tokens cost in the main index against the recent table, and what the
merge that moves them costs (issue 55, goal 6; app/services/token_merge.py), side by side in
one run, through Lethe's own database layer (SQLite, its pragmas: WAL, 16 KiB pages,
synchronous=FULL for a durable commit, secure_delete):

- `main`: an append's `k` id tokens inserted into a `sample_tokens` of `n` (as before
  migration 0028: `insert_rows` into the main table);
- `recent`: the same into `sample_tokens_recent` (`sample_tokens.insert_new`), empty and
  holding `waiting` tokens already (the most a merge's threshold leaves there while quiet);
- `merge`: `token_merge.merge` of `waiting` tokens into the `n`: its time, its slowest
  transaction (how long it can hold the write lock from a deletion) and the WAL it wrote;
- `duplicate_check`: an append's duplicate check of its `k` ids (none held), as before
  migration 0028 (the main table, through SQLAlchemy's expanding IN) and now
  (`sample_tokens.held`: both tables, through the driver), best of three each.

Each insert's time is split into the statements and the commit (the WAL's write and fsync);
`wal_mb` is the WAL file after the commit (checkpointed before each variant), `written_mb`
what the process passed to write() meanwhile.

    .venv/bin/python -m bench.token_merge [--n 1000000] [--k 10000] [--waiting 50000]

Writes bench/results/token_merge.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.db.bulk import insert_rows
from app.db.chunks import chunked
from app.db.migrate import upgrade_to_head
from app.db.session import Database
from app.db.tables import Dataset
from app.services import sample_tokens, token_merge
from app.services.registration import APPEND_CACHE_KIB
from app.states import DatasetStatus
from app.storage.crypto import TOKEN_PREFIX
from bench.common import write_result


def tokens(count: int, start: int) -> list[tuple[int, str, int]]:
    """(dataset 1, a random-looking token, sample id) rows, as keyed tokens are."""
    import base64
    import hashlib

    out = []
    for i in range(start, start + count):
        mac = hashlib.sha256(i.to_bytes(8, "big")).digest()[:24]
        out.append((1, TOKEN_PREFIX + base64.urlsafe_b64encode(mac).decode(), i))
    return out


def checkpoint(db: Database) -> None:
    """The WAL copied back and emptied (a raw connection: no BEGIN around the pragma)."""
    raw = db.engine.raw_connection()
    try:
        raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        raw.close()


def written() -> int:
    """Bytes this process has passed to write() (/proc/self/io `wchar`): the WAL's frames and
    any checkpoint's copy of them into the database file."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise RuntimeError("no wchar in /proc/self/io")


def wal_mb(path: Path) -> float:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size / 1e6 if wal.exists() else 0.0


def timed_insert(db: Database, path: Path, table: Any, rows: list[tuple[int, str, int]]) -> dict:
    """`rows` into `table` in one durable transaction: statements, commit, WAL."""
    checkpoint(db)
    before = written()
    with db.write() as session:
        conn = session.connection()
        conn.exec_driver_sql("PRAGMA wal_autocheckpoint=0")  # the WAL measured whole
        conn.exec_driver_sql(f"PRAGMA cache_size=-{APPEND_CACHE_KIB}")  # as an append's writer
        t0 = time.perf_counter()
        insert_rows(conn, table, sample_tokens.COLUMNS, rows)
        statements = time.perf_counter() - t0
        t1 = time.perf_counter()
    commit = time.perf_counter() - t1
    out = {"statements_s": statements, "commit_s": commit, "total_s": statements + commit}
    out["wal_mb"], out["written_mb"] = wal_mb(path), (written() - before) / 1e6
    with db.engine.begin() as conn:  # put back: the next variant starts from the same tables
        conn.execute(table.delete().where(table.c.sample_id.in_([r[2] for r in rows])))
        conn.exec_driver_sql("PRAGMA wal_autocheckpoint=1000")
    return out


def timed_merge(db: Database, path: Path, rows: list[tuple[int, str, int]]) -> dict:
    """`token_merge.merge` of `rows` waiting in the recent table."""
    with db.engine.begin() as conn:
        insert_rows(conn, sample_tokens.RECENT, sample_tokens.COLUMNS, rows)
    checkpoint(db)
    before = written()
    merged = token_merge.merge(db, threshold=1)
    return {
        "moved": merged.moved,
        "total_s": merged.seconds,
        "longest_transaction_s": merged.longest_s,
        "transactions": -(-len(rows) // token_merge.BATCH),
        "wal_mb": wal_mb(path),  # the merge's connections checkpoint every 1,000 pages
        "written_mb": (written() - before) / 1e6,  # the WAL's frames and those checkpoints
    }


def held_before(db: Database, probe: list[str]) -> set[str]:
    """The duplicate check before migration 0028: the main table only, through SQLAlchemy."""
    table, found = sample_tokens.TOKENS, set[str]()
    with db.read() as session:
        for chunk in chunked(sorted(set(probe))):
            named = select(table.c.token).where(table.c.dataset_id == 1, table.c.token.in_(chunk))
            found.update(session.scalars(named))
    return found


def held_now(db: Database, probe: list[str]) -> set[str]:
    with db.read() as session:
        return sample_tokens.held(session, 1, probe)


def timed_checks(db: Database, probe: list[str]) -> dict[str, float]:
    out = {}
    for name, check in (("before_main_only", held_before), ("now_both_tables", held_now)):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            assert not check(db, probe)
            times.append(time.perf_counter() - t0)
        out[f"{name}_s"] = min(times)
    return out


def run(n: int, k: int, waiting: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "lethe.db"
        url = f"sqlite:///{path}"
        upgrade_to_head(url)
        db = Database(url)
        with db.write() as session:
            session.add(
                Dataset(
                    id=1,
                    name="tokens",
                    kind="tabular",
                    source="bench",
                    feature_shape=[1],
                    n_classes=2,
                    n_samples=n,
                    status=DatasetStatus.ready,
                )
            )
        with db.engine.begin() as conn:  # a registration's: sorted, in the main table
            insert_rows(conn, sample_tokens.TOKENS, sample_tokens.COLUMNS, sorted(tokens(n, 0)))
        appended = tokens(k, 10 * n)
        out: dict[str, Any] = {"n": n, "k": k, "waiting": waiting}
        out["main"] = timed_insert(db, path, sample_tokens.TOKENS, appended)
        out["recent_empty"] = timed_insert(db, path, sample_tokens.RECENT, appended)
        with db.engine.begin() as conn:
            insert_rows(conn, sample_tokens.RECENT, sample_tokens.COLUMNS, tokens(waiting, 20 * n))
        out["recent_holding_waiting"] = timed_insert(db, path, sample_tokens.RECENT, appended)
        out["duplicate_check"] = timed_checks(db, [t for _, t, _ in appended])
        with db.engine.begin() as conn:
            conn.execute(sample_tokens.RECENT.delete())
        out["merge"] = timed_merge(db, path, tokens(waiting, 20 * n))
        db.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10_000)
    parser.add_argument("--waiting", type=int, default=50_000)
    parser.add_argument("--out", default="token_merge")
    args = parser.parse_args()
    result = run(args.n, args.k, args.waiting)
    print(result)
    print(write_result(args.out, result))


if __name__ == "__main__":
    main()
