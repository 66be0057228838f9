"""Where PostgreSQL's time goes in a stream of distributed deletions (issue 28, goal 3).

A `lethe serve` and one `lethe worker` on a fresh PostgreSQL database (bench.resident's
deployment), one model, three warm-up deletions, then `--deletions` sequential single-sample
deletions (each followed by the client's read of the model). Reports, per deletion, the CPU of
each PostgreSQL process that worked (from /proc) and, from pg_stat_statements, each statement's
calls, execution and planning time. pg_stat_statements must be loaded by the server, which
takes a restart; as a superuser on the development machine:

    psql -c "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"
    pg_ctlcluster 15 main restart
    psql -c "ALTER SYSTEM SET pg_stat_statements.track_planning = on" -c "SELECT pg_reload_conf()"
    .venv/bin/python -m bench.pg_time [--method output_perturbation] [--n 10000] [--deletions 40]
    psql -c "ALTER SYSTEM RESET pg_stat_statements.track_planning" \
        -c "ALTER SYSTEM RESET shared_preload_libraries"; pg_ctlcluster 15 main restart

Writes bench/results/<out>.json.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from bench.common import cpu_seconds, write_result
from bench.resident import deployment, trained_model

ADMIN = "host=127.0.0.1 user=postgres dbname=postgres"


def postgres_processes() -> dict[int, tuple[str, float]]:
    """pid -> (its title, CPU seconds so far) of every PostgreSQL process."""
    found = subprocess.run(["pgrep", "-f", "postgres"], capture_output=True, text=True).stdout
    out = {}
    for pid in found.split():
        with contextlib.suppress(FileNotFoundError):  # a backend that ended since pgrep
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            out[int(pid)] = (title.strip(), cpu_seconds(int(pid)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="output_perturbation")
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--deletions", type=int, default=40)
    parser.add_argument("--out", default="pg_time")
    args = parser.parse_args()
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    with (
        tempfile.TemporaryDirectory() as tmp,
        deployment(Path(tmp) / "lethe", "distributed", resident=2) as (c, _),
    ):
        ds_id, model_id, ids = trained_model(c, args.method, args.n, args.deletions + 3)
        for sample in ids[:3]:  # warm
            c.wait_deletion(c.delete(ds_id, [sample]).id)
        time.sleep(1.5)  # the warm-up's compaction
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute("SELECT pg_stat_statements_reset()")
        before, t0 = postgres_processes(), time.perf_counter()
        for sample in ids[3:]:
            c.wait_deletion(c.delete(ds_id, [sample]).id)
            c.model(model_id)
        seconds, after = time.perf_counter() - t0, postgres_processes()
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            rows = admin.execute(
                "SELECT calls, total_exec_time, total_plan_time, plans,"
                " regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements"
                " ORDER BY total_exec_time + total_plan_time DESC"
            ).fetchall()
    n = len(ids) - 3
    processes: collections.Counter[str] = collections.Counter()
    for pid, (title, cpu) in after.items():
        spent = cpu - before.get(pid, (title, 0.0))[1]
        if spent > 0:
            processes[f"{pid} {title[:80]}"] += spent * 1000 / n
    statements = [
        {
            "calls_per_deletion": calls / n,
            "exec_ms_per_deletion": exec_ms / n,
            "plan_ms_per_deletion": plan_ms / n,
            "plans": plans,
            "statement": query[:300],
        }
        for calls, exec_ms, plan_ms, plans, query in rows
    ]
    result = {
        "method": args.method,
        "n": args.n,
        "deletions": n,
        "wall_ms_per_deletion": seconds * 1000 / n,
        "cpu_ms_per_deletion": dict(processes.most_common()),
        "exec_ms_per_deletion": sum(s["exec_ms_per_deletion"] for s in statements),
        "plan_ms_per_deletion": sum(s["plan_ms_per_deletion"] for s in statements),
        "statements": statements,
    }
    print(
        f"{n} deletions, {result['wall_ms_per_deletion']:.1f} ms each; PostgreSQL per deletion: "
        f"{result['exec_ms_per_deletion']:.2f} ms executing, {result['plan_ms_per_deletion']:.2f} "
        "ms planning"
    )
    for name, ms in processes.most_common(8):
        print(f"{ms:6.2f} ms CPU  {name}")
    for s in statements[:25]:
        print(
            f"{s['calls_per_deletion']:5.2f} calls {s['exec_ms_per_deletion']:7.3f} exec "
            f"{s['plan_ms_per_deletion']:6.3f} plan  {s['statement'][:100]}"
        )
    print("wrote", write_result(args.out, result))


if __name__ == "__main__":
    main()
