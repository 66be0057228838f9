"""Where a registration's `samples` inserts go (issue 55, goal 6), in plain SQLite with the
pragmas Lethe's registration sets (WAL, synchronous=NORMAL, 32 MB cache, 25,000-page
checkpoints): 1,000,000 rows shaped as a registration's (a keyed token as the external id,
no subject, a block's time-ordered key), 5,000 per commit, into a copy of the `samples`
table as of migration 0025, and the same with one thing changed at a time:

- `sequential_tokens`: tokens that grow with the row (how an index of them would fill if
  rows came in token order): what the unique index's randomness costs;
- `no_unique`: without the (dataset_id, external_id) unique index at all;
- `no_indexes`: the table alone;
- `commits_of_50000`: ten chunks per commit;
- `token_table`: no unique index on `samples`; the tokens written last, sorted, 5,000 per
  commit, into a table of their own keyed (dataset_id, token) (`tokens_s`: the sort and
  those inserts), as Lethe does since migration 0026 (`app/services/sample_tokens.py`).

Each variant's time is split into the executemany calls and the commits (where the WAL takes
the dirty pages). Nothing here is Lethe's code path: `bench/registration_stages.py` times that.

    .venv/bin/python -m bench.samples_insert [--n 1000000]

Writes bench/results/samples_insert.json.
"""

from __future__ import annotations

import argparse
import base64
import hmac
import sqlite3
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import write_result

CHUNK = 5000
TABLE = (
    "CREATE TABLE samples (id INTEGER PRIMARY KEY, dataset_id INTEGER, external_id VARCHAR(200),"
    " subject_id VARCHAR(200), split VARCHAR(10), payload BLOB, key_id CHAR(32),"
    " status VARCHAR(10), erased_at DATETIME, append_id INTEGER, block_row INTEGER{unique})"
)
TOKENS = (
    "CREATE TABLE sample_tokens (dataset_id INTEGER, token VARCHAR(200), sample_id INTEGER,"
    " PRIMARY KEY (dataset_id, token)) WITHOUT ROWID"
)
INDEXES = [
    "CREATE INDEX ix_subject ON samples (dataset_id, subject_id)",
    "CREATE INDEX ix_split ON samples (dataset_id, split, status)",
    "CREATE INDEX ix_append ON samples (append_id)",
    "CREATE INDEX ix_key ON samples (key_id)",
]
VARIANTS = {
    "as_registered": {},
    "sequential_tokens": {"sequential": True},
    "no_unique": {"unique": False},
    "no_indexes": {"unique": False, "indexes": False},
    "commits_of_50000": {"group": 10},
    "token_table": {"unique": False, "token_table": True},
}


def token(i: int) -> str:
    mac = hmac.digest(b"bench", f"sample\0{1}\0{i}".encode(), "sha256")
    return "t1_" + base64.urlsafe_b64encode(mac[:24]).decode()


def insert(
    folder: Path,
    tokens: list[str],
    sequential: bool = False,
    unique: bool = True,
    indexes: bool = True,
    group: int = 1,
    token_table: bool = False,
) -> dict[str, float]:
    n = len(tokens)
    db = sqlite3.connect(folder / "samples.db", isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "cache_size=-32768",
                   "wal_autocheckpoint=25000", "secure_delete=ON"):  # fmt: skip
        db.execute(f"PRAGMA {pragma}")
    db.execute(TABLE.format(unique=", UNIQUE (dataset_id, external_id)" if unique else ""))
    for statement in INDEXES if indexes else []:
        db.execute(statement)
    keys = [uuid.UUID(int=(1 << 100) + block).hex for block in range(n // 64 + 1)]
    statement = (
        "INSERT INTO samples (dataset_id, external_id, subject_id, split, payload, key_id,"
        " status, append_id, block_row) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
    )
    executing = committing = 0.0
    started = time.perf_counter()
    for number, start in enumerate(range(0, n, CHUNK)):
        rows = [
            (1, f"t1_{i:032d}" if sequential else tokens[i], None,
             "test" if i % 5 == 0 else "train", None, keys[i // 64], "active", None, i % 64)
            for i in range(start, min(start + CHUNK, n))
        ]  # fmt: skip
        if number % group == 0:
            db.execute("BEGIN IMMEDIATE")
        t = time.perf_counter()
        db.executemany(statement, rows)
        executing += time.perf_counter() - t
        if number % group == group - 1 or start + CHUNK >= n:
            t = time.perf_counter()
            db.execute("COMMIT")
            committing += time.perf_counter() - t
    tokens_s = 0.0
    if token_table:  # the tokens after the rows, sorted, into a table of their own
        t = time.perf_counter()
        db.execute(TOKENS)
        ordered = sorted(range(n), key=tokens.__getitem__)
        for start in range(0, n, CHUNK):
            db.execute("BEGIN IMMEDIATE")
            db.executemany(
                "INSERT INTO sample_tokens (dataset_id, token, sample_id) VALUES (?, ?, ?)",
                [(1, tokens[i], i + 1) for i in ordered[start : start + CHUNK]],
            )
            db.execute("COMMIT")
        tokens_s = time.perf_counter() - t
    total = time.perf_counter() - started
    db.close()
    return {"total_s": round(total, 3), "execute_s": round(executing, 3),
            "commit_s": round(committing, 3), "tokens_s": round(tokens_s, 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    args = parser.parse_args()
    tokens = [token(i) for i in range(args.n)]
    result: dict[str, object] = {"n": args.n, "rows_per_commit": CHUNK}
    for name, options in VARIANTS.items():
        with tempfile.TemporaryDirectory(prefix="lethe-insert-") as folder:
            result[name] = insert(Path(folder), tokens, **options)  # type: ignore[arg-type]
        print(name, result[name], flush=True)
    write_result("samples_insert", result)


if __name__ == "__main__":
    main()
