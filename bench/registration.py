"""Registering a large dataset, side by side in one run: the builtin
generator (`{"builtin": "synthetic", ...}`) against a Parquet object of the same shape read
from object storage (SeaweedFS, `{"source": {"s3": ...}}`), each POST→ready as a client sees
it (the POST answers 202 past 10,000 rows; the bench polls until ready), the rate, and the
peak RSS of every process of the service while it runs (the registration's child is one of
the API's upload pool). Also the time to write the same bytes to this disk (the floor).

    .venv/bin/python -m bench.registration [--n 1000000] [--features 256] [--row-group 65536]
        [--only builtin_generator parquet_from_s3 parquet_with_subjects_from_s3]
        [--out registration]

`parquet_with_subjects_from_s3` is the same Parquet with a subject column (two rows a person),
registered with `subject_column`.

Writes bench/results/registration.json.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app.client import Client
from bench.common import children, write_result
from tests.support.cluster import Cluster
from tests.support.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedServer

BUCKET = "bench-sources"
RUNS = ["builtin_generator", "parquet_from_s3", "parquet_with_subjects_from_s3"]


def parquet_bytes(n: int, d: int, row_group: int, subjects: bool = False) -> bytes:
    """n × d float32 features (one fixed-size list column), ids and labels; with `subjects`, a
    subject column too (two rows per person)."""
    rng = np.random.default_rng(0)
    out = io.BytesIO()
    columns = [("id", pa.string()), ("label", pa.int64()), ("x", pa.list_(pa.float32(), d))]
    schema = pa.schema(columns + ([("subject", pa.string())] if subjects else []))
    with pq.ParquetWriter(out, schema) as writer:
        for start in range(0, n, row_group):
            m = min(row_group, n - start)
            X = rng.standard_normal((m, d), dtype=np.float32)
            values: dict[str, Any] = {
                "id": [f"r{i}" for i in range(start, start + m)],
                "label": rng.integers(0, 10, m),
                "x": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), d),
            }
            if subjects:
                values["subject"] = [f"person-{i // 2}" for i in range(start, start + m)]
            table = pa.table(values, schema=schema)
            writer.write_table(table, row_group_size=row_group)
    return out.getvalue()


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it (the upload pool's workers are the fork server's
    children, grandchildren of the API)."""
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        found.append(here)
        with contextlib.suppress(OSError):
            todo += children(here)
    return found


def is_upload_child(pid: int) -> bool:
    """Whether `pid` is one of the upload pool's children: its parent is multiprocessing's
    fork server (app/core/services/isolated.py), told by its command line."""
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return b"forkserver" in Path(f"/proc/{parent}/cmdline").read_bytes()
    except (OSError, ValueError, IndexError):
        return False


class PeakWatch:
    """The largest RSS each process under the API reaches, sampled every 50 ms, and the
    first RSS seen of each upload child (what it inherits from the fork server: the imports,
    before it reads anything)."""

    def __init__(self, api: int) -> None:
        self.api, self.peaks, self._stop = api, dict[int, float](), threading.Event()
        self.first, self.uploads = dict[int, float](), set[int]()
        self.at_peak = dict[int, dict[str, float]]()  # an upload child's memory at its peak
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for pid in descendants(self.api):
                rss = rss_mib(pid)
                if pid not in self.peaks and is_upload_child(pid):
                    self.uploads.add(pid)
                    self.first[pid] = rss
                if pid in self.uploads and rss > self.peaks.get(pid, 0.0):
                    self.at_peak[pid] = rollup(pid)
                self.peaks[pid] = max(self.peaks.get(pid, 0.0), rss)

    def upload_child(self) -> dict[str, float]:
        """The registration's child: its first and peak RSS (the largest, if several ran)."""
        if not self.uploads:
            return {}
        pid = max(self.uploads, key=lambda p: self.peaks[p])
        return {"first_seen": self.first[pid], "peak": self.peaks[pid], **self.at_peak[pid]}


def rollup(pid: int) -> dict[str, float]:
    """Where a process's resident memory is (MiB): its own anonymous memory (the heap, what
    it decoded and sealed), and the pages of files (libraries) and of memory shared with
    the fork server it came from, which it only touched."""
    fields = {"Anonymous": "anonymous", "Private_Dirty": "private_dirty", "Pss": "pss"}
    found: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            name = line.split(":")[0]
            if name in fields:
                found[fields[name]] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return found


def register(c: Client, body: dict[str, Any], api: int) -> dict[str, Any]:
    with PeakWatch(api) as watch:
        t0 = time.perf_counter()
        answer = c.post("/v1/datasets", json=body)
        answered = time.perf_counter() - t0
        while answer["status"] == "registering":
            time.sleep(0.2)
            answer = c.get(f"/v1/datasets/{answer['id']}")
        took = time.perf_counter() - t0
    assert answer["status"] == "ready", answer
    peaks = sorted(watch.peaks.values(), reverse=True)
    return {
        "post_answered_s": answered,
        "post_to_ready_s": took,
        "rows_per_second": answer["n_samples"] / took,
        "peak_rss_mib": {
            "api": watch.peaks.get(api, 0.0),
            "largest_other": peaks[0],
            "registration_child": watch.upload_child(),
        },
    }


def disk_floor(data: bytes, where: Path) -> float:
    """Seconds to write and fsync these bytes to this disk."""
    path = where / "floor.bin"
    t0 = time.perf_counter()
    with path.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    took = time.perf_counter() - t0
    path.unlink()
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--row-group", type=int, default=65_536)
    parser.add_argument("--only", nargs="+", choices=RUNS, help="these runs (default: all)")
    parser.add_argument("--out", default="registration", help="results/OUT.json")
    args = parser.parse_args()
    n, d = args.n, args.features
    with tempfile.TemporaryDirectory(prefix="lethe-registration-") as tmp:
        seaweed = SeaweedServer(Path(tmp) / "seaweed")
        seaweed.start()
        try:
            t0 = time.perf_counter()
            data = parquet_bytes(n, d, args.row_group)
            made_s = time.perf_counter() - t0
            wanted = args.only or RUNS
            s3 = {
                "s3_endpoint_url": seaweed.endpoint,
                "s3_region": "us-east-1",
                "s3_access_key_id": S3_ACCESS_KEY,
                "s3_secret_access_key": S3_SECRET_KEY,
            }
            cluster = Cluster(
                Path(tmp) / "data",
                None,
                None,
                max_dataset_cells=n * d,
                max_dataset_samples=n,
                **s3,
            )
            from app.core.formats.s3 import s3_client
            from app.core.settings import Settings

            client = s3_client(Settings(data_dir=Path(tmp), **s3))  # type: ignore[arg-type]
            client.create_bucket(Bucket=BUCKET)
            client.put_object(Bucket=BUCKET, Key="people.parquet", Body=data)
            if "parquet_with_subjects_from_s3" in wanted:
                with_subjects = parquet_bytes(n, d, args.row_group, subjects=True)
                client.put_object(Bucket=BUCKET, Key="subjects.parquet", Body=with_subjects)
                del with_subjects
            row_group_mib = n and (min(args.row_group, n) * (d * 4 + 16)) / 2**20
            with cluster:
                c = Client(cluster.start_api(), cluster.admin_key, timeout=3600)
                assert cluster.api is not None
                api = cluster.api.pid
                builtin = {"builtin": "synthetic", "n_samples": n, "n_features": d,
                           "n_classes": 10}  # fmt: skip
                source = {"source": {"s3": {"bucket": BUCKET, "key": "people.parquet"}},
                          "label_column": "label", "id_column": "id"}  # fmt: skip
                named = {"s3": {"bucket": BUCKET, "key": "subjects.parquet"}}
                subjects = {**source, "source": named, "subject_column": "subject"}
                runs = {}
                bodies = {"builtin_generator": builtin, "parquet_from_s3": source,
                          "parquet_with_subjects_from_s3": subjects}  # fmt: skip
                for name in RUNS:
                    body = bodies[name]
                    if name in wanted:
                        runs[name] = register(c, body, api)
                        print(runs, flush=True)
            result = {
                "n": n,
                "features": d,
                "row_group_rows": args.row_group,
                "row_group_mib": row_group_mib,
                "rss_target_mib": 1.5 * row_group_mib + 300,  # the goal 6
                "parquet_bytes": len(data),
                "parquet_written_in_s": made_s,
                "disk_floor_s": disk_floor(data, Path(tmp)),
                "runs": runs,
            }
        finally:
            seaweed.kill()
    print(write_result(args.out, result))


if __name__ == "__main__":
    main()
