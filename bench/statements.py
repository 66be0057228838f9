"""SQL statements per distributed deletion, per process (issue 28, goal 3).

A `lethe serve` and one `lethe worker` on a fresh PostgreSQL database (bench.resident's
deployment), one model, three warm-up deletions, then `--deletions` sequential single-sample
deletions (each followed by the client's read of the model, as in bench.resident) with
PostgreSQL logging every statement (`log_min_duration_statement = 0`, set with ALTER SYSTEM
for the run and reset after: it needs a superuser and the server's log file). Each logged
statement is credited to the API or the worker by its backend's client port. Writes the
statements per deletion of each process, and of each statement text, to
bench/results/<out>.json.

    .venv/bin/python -m bench.statements [--method output_perturbation] [--n 10000]
        [--deletions 8] [--log /var/log/postgresql/postgresql-15-main.log]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.common import write_result
from bench.resident import METHODS, deployment, trained_model
from tests.databases import PG_ADMIN_URL

LINE = re.compile(
    r"\[(\d+)\] (\S+) \S* LOG:  duration: ([\d.]+) ms  (?:statement|execute [^:]*): (.*)"
)


def log_every_statement(admin: sa.Engine, on: bool) -> None:
    with admin.connect() as conn:
        if on:
            conn.execute(sa.text("ALTER SYSTEM SET log_min_duration_statement = 0"))
            conn.execute(sa.text("ALTER SYSTEM SET log_line_prefix = '%m [%p] %d %a '"))
        else:
            conn.execute(sa.text("ALTER SYSTEM RESET log_min_duration_statement"))
            conn.execute(sa.text("ALTER SYSTEM RESET log_line_prefix"))
        conn.execute(sa.text("SELECT pg_reload_conf()"))


def owners(pids: dict[str, int]) -> dict[int, str]:
    """Local TCP port -> the process ("api", "worker") that holds a connection from it."""
    found: dict[int, str] = {}
    listing = subprocess.run(["ss", "-tnp"], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        for name, pid in pids.items():
            if f"pid={pid}," in line and ":5432" in line:
                found[int(line.split()[3].rsplit(":", 1)[1])] = name
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="output_perturbation", choices=list(METHODS))
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--deletions", type=int, default=8)
    parser.add_argument("--log", default="/var/log/postgresql/postgresql-15-main.log")
    parser.add_argument("--out", default="statements")
    args = parser.parse_args()
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    log = Path(args.log)
    with (
        tempfile.TemporaryDirectory() as tmp,
        deployment(Path(tmp), "distributed", 2) as (
            c,
            cluster,
        ),
    ):
        ds_id, model_id, ids = trained_model(c, args.method, args.n, 50)
        for sample in ids[:3]:  # warm: the resident session, the pools, prepared statements
            c.wait_deletion(c.delete(ds_id, [sample]).id)
            c.model(model_id)
        time.sleep(1.5)  # the compaction the warm-up asked for
        assert cluster.api is not None
        pids = {"api": cluster.api.pid, "worker": cluster.workers[0].pid}
        name = sa.make_url(cluster.env["LETHE_DATABASE_URL"]).database
        start = log.stat().st_size
        log_every_statement(admin, True)
        try:
            time.sleep(0.3)
            for sample in ids[3 : 3 + args.deletions]:
                c.wait_deletion(c.delete(ds_id, [sample]).id)
                c.model(model_id)
            time.sleep(1.5)  # the compaction the last deletions asked for
        finally:
            log_every_statement(admin, False)
        with admin.connect() as conn:
            backends = conn.execute(
                sa.text("SELECT pid, client_port FROM pg_stat_activity WHERE datname = :d"),
                {"d": name},
            ).all()
        port_owner = owners(pids)
        backend = {pid: port_owner.get(port, "other") for pid, port in backends}
    with log.open("rb") as fh:
        fh.seek(start)
        text = fh.read().decode(errors="replace")
    per: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[tuple[str, str]] = collections.Counter()
    for m in LINE.finditer(text):
        if m.group(2) != name:
            continue
        who = backend.get(int(m.group(1)), "gone")
        per[who] += 1
        kinds[(who, re.sub(r"\s+", " ", m.group(4))[:100])] += 1
    k = args.deletions
    result: dict[str, Any] = {
        "method": args.method,
        "n": args.n,
        "deletions": k,
        "statements_per_deletion": {who: round(v / k, 2) for who, v in per.items()},
        "by_statement": [
            {"process": who, "statement": s, "per_deletion": round(v / k, 2)}
            for (who, s), v in kinds.most_common()
        ],
    }
    print(result["statements_per_deletion"])
    write_result(args.out, result)


if __name__ == "__main__":
    main()
