"""A single-sample deletion's POST→certificate with an append's tokens waiting in the recent
tables (stop 78, migration 0028: an appended row's id and subject tokens go to
`sample_tokens_recent` / `subject_tokens_recent`, and every reader reads both tables), against
the tree before those tables, side by side in one run (issue 55).

Per tree: embedded `lethe serve` (SQLite), builtin synthetic `--n` × 20, 2 classes, two rows a
person (`subject_size` 2), a convex_head model; one deletion warms its session. Then, timed
from the POST to the certificate (`Prefer: wait`, then the long poll) one after another:
`--deletions` deletions of one original row by sample id; an append of `--k` rows (new ids,
two a person) and its learned version; then `--deletions` each of one appended row by sample
id, one appended person by subject id, and one original row by sample id.

    .venv/bin/python -m bench.deletion_tokens --other /tmp/before [--n 1000000] [--k 10000]
        [--deletions 8] [--out deletion_tokens]

The tree in `--other` needs this file (copy it there: `run_in_tree`). Writes
bench/results/<out>.json: per tree, every time, their medians, and how many tokens the recent
tables held when the deletions began and ended.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import ready, run_in_tree, write_result

OPTIONS = {"lam": 1e-3, "R": 20.0, "beta": 1e-3}


def one(n: int, k: int, deletions: int) -> dict[str, Any]:
    """The deletions' times in one service of this tree."""
    from app.client import Client
    from bench.cluster import Cluster

    spec = {"builtin": "synthetic", "n_samples": n, "n_features": 20, "n_classes": 2,
            "subject_size": 2}  # fmt: skip
    rng = np.random.default_rng(0)
    upload = io.BytesIO()
    np.savez(
        upload,
        X=rng.standard_normal((k, 20)).astype(np.float32),
        y=rng.integers(0, 2, k),
        ids=np.array([f"new-{i}" for i in range(k)]),
        subjects=np.array([f"new-person-{i // 2}" for i in range(k)]),
    )
    limits = {"max_dataset_samples": n, "job_timeout_seconds": 7200,
              "plaintext_ttl_seconds": 3600}  # fmt: skip  # no recycle within the run
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp), None, None, **limits) as cluster:
        c = Client(cluster.start_api(), cluster.admin_key, timeout=600)
        dataset = ready(c, c.post("/v1/datasets", json=spec))
        body = {"name": "head", "dataset_id": dataset["id"], "architecture": {"type": "logreg"},
                "method": {"name": "convex_head", **OPTIONS}}  # fmt: skip
        c.wait_model(c.create_model(body).id)
        samples = f"/v1/datasets/{dataset['id']}/samples"
        listed = c.get(samples, params={"limit": 4 * deletions + 1, "split": "train"})["items"]
        originals = [row["external_id"] for row in listed]  # training rows: every model moves

        def timed(
            sample_ids: list[str] | None = None, subject_ids: list[str] | None = None
        ) -> float:
            t0 = time.perf_counter()
            answer = c.delete(dataset["id"], sample_ids, subject_ids, wait=30)
            if answer.status not in ("done", "failed"):
                answer = c.wait_deletion(answer.id)
            assert answer.status == "done", answer
            return time.perf_counter() - t0

        timed([originals.pop()])  # warms the session
        times: dict[str, list[float]] = {"original_before_append": []}
        for _ in range(deletions):
            times["original_before_append"].append(timed([originals.pop()]))
        appended = c.post(
            f"/v1/datasets/{dataset['id']}/samples", files={"file": ("new.npz", upload.getvalue())}
        )
        c.wait_append(dataset["id"], appended["id"], poll=30.0)
        total = c.get(samples, params={"limit": 1, "split": "train"})["total"]
        last = c.get(samples, params={"limit": 1000, "split": "train", "offset": total - 1000})
        new = [row for row in last["items"] if row["external_id"].startswith("new-")]
        assert len(new) >= 2 * deletions, len(new)
        recent_at_start = _recent(Path(tmp))
        times |= {"appended_sample": [], "appended_person": [], "original_after_append": []}
        for i in range(deletions):
            times["appended_sample"].append(timed([new[2 * i]["external_id"]]))
            times["appended_person"].append(timed(subject_ids=[new[2 * i + 1]["subject_id"]]))
            times["original_after_append"].append(timed([originals.pop()]))
        return {
            "times_s": times,
            "median_s": {kind: statistics.median(ts) for kind, ts in times.items()},
            "recent_tokens_at_start": recent_at_start,
            "recent_tokens_at_end": _recent(Path(tmp)),
        }


def _recent(data_dir: Path) -> dict[str, int] | None:
    """Rows in the recent token tables (None: the tree has none)."""
    with contextlib.closing(sqlite3.connect(data_dir / "lethe.db")) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        if "sample_tokens_recent" not in tables:
            return None
        return {
            t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("sample_tokens_recent", "subject_tokens_recent")
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=10_000)
    parser.add_argument("--deletions", type=int, default=8)
    parser.add_argument("--other", type=Path, help="an older source tree, run first")
    parser.add_argument("--out", default="deletion_tokens")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = ["--n", str(args.n), "--k", str(args.k), "--deletions", str(args.deletions)]
    if args.one:
        print(json.dumps(one(args.n, args.k, args.deletions)))
        return
    trees: dict[str, Any] = {}
    here = Path(__file__).resolve().parents[1]
    for tree in [args.other, here] if args.other is not None else [here]:
        commit, found = run_in_tree(tree, "bench.deletion_tokens", shape)
        trees[f"{'this tree' if tree == here else 'before'} ({commit})"] = found
        print(commit, json.dumps(found["median_s"]), found["recent_tokens_at_start"], flush=True)
    print(write_result(args.out, {"n": args.n, "k": args.k, "trees": trees}))


if __name__ == "__main__":
    main()
