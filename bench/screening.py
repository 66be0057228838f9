"""Where a registration screens its rows against the suppression list (issue 55, goals 4 and
6), side by side in one run, alternating: `registration.register` end to end, in process,
1,000,000 × 256 float32 from Parquet with client ids and a subject per two rows, on the
embedded SQLite, against a list of `--listed` erased subjects and samples (none of them in
the upload):

- `per_chunk` (now): each chunk screened as it is sealed, while the chunk before is written,
  and the list read again in the last commit for anyone put on it meanwhile;
- `whole_first` (before): the whole upload screened before the first chunk is sealed (the
  same `Screener`, run over every row on the first chunk's turn), as registrations did until
  this bench's commit.

    .venv/bin/python -m bench.screening [--n 1000000] [--features 256] [--runs 2]

Writes bench/results/screening.json.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from app.runtime import Runtime
from app.services import registration
from app.services.dataset_files import Limits
from app.services.parquet_files import Columns, parse_parquet
from app.services.suppression import Screener, entries, put_tokens
from bench.common import alternating, write_result
from bench.registration_stages import fresh_runtime


def people_parquet(n: int, d: int, row_group: int = 65536) -> bytes:
    """`n` rows of `d` float32 features, a client id each and a subject per two rows."""
    rng = np.random.default_rng(0)
    sink = io.BytesIO()
    schema = pa.schema(
        [
            ("id", pa.string()),
            ("subject", pa.string()),
            ("label", pa.int64()),
            ("x", pa.list_(pa.float32(), d)),
        ]  # fmt: skip
    )
    with pq.ParquetWriter(sink, schema) as writer:
        for start in range(0, n, row_group):
            stop = min(start + row_group, n)
            features = rng.standard_normal((stop - start, d), dtype=np.float32)
            writer.write_table(
                pa.table(
                    {
                        "id": [f"row-{i:07d}" for i in range(start, stop)],
                        "subject": [f"person-{i // 2:07d}" for i in range(start, stop)],
                        "label": (np.arange(start, stop) % 2).astype(np.int64),
                        "x": pa.FixedSizeListArray.from_arrays(features.reshape(-1), d),
                    },
                    schema=schema,
                )
            )
    return sink.getvalue()


def listed(runtime: Runtime, count: int) -> None:
    """`count` erased subjects and as many samples on the list, none of them in the upload."""
    ring = runtime.keyring
    with runtime.db.write() as session:
        for kind in ("subject", "sample"):
            gone = [f"gone-{kind}-{i}" for i in range(count)]
            put_tokens(session, entries(ring, kind, gone), None)


@contextlib.contextmanager
def whole_first() -> Iterator[None]:
    """Every row screened on the first chunk's turn, before anything is sealed or written."""
    saved = registration._screened_chunk

    def screened(
        runtime: Runtime, screener: Screener, start: int, stop: int, refusing: bool
    ) -> Sequence[int]:
        if start == 0:
            with runtime.db.read() as session:
                if screener.rest(session, 0).rows:
                    raise screener.screening().refusal()
        return range(start, stop)

    registration._screened_chunk = screened
    try:
        yield
    finally:
        registration._screened_chunk = saved


def register(runtime: Runtime, data: bytes) -> float:
    """POST→ready's own work, as `bench.registration_stages.whole` times it."""
    with runtime.db.write() as session:
        dataset_id = registration.begin(session, "screening", "parquet")
    started = time.perf_counter()
    columns = Columns(label="label", id="id", subject="subject")
    parsed = parse_parquet(data, columns, 0, 0.2, Limits.from_settings(runtime.settings))
    registration.register(runtime, dataset_id, parsed)
    return time.perf_counter() - started


MODES = {"per_chunk": contextlib.nullcontext, "whole_first": whole_first}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--listed", type=int, default=10_000)
    args = parser.parse_args()
    data = people_parquet(args.n, args.features)
    took: dict[str, list[float]] = {name: [] for name in MODES}
    with tempfile.TemporaryDirectory(prefix="lethe-screening-") as scratch:
        for run, name in alternating(list(MODES), args.runs):
            runtime = fresh_runtime(Path(scratch), f"{name}-{run}", args.n, args.features)
            listed(runtime, args.listed)
            with MODES[name]():
                took[name].append(round(register(runtime, data), 3))
            print(name, took[name][-1], flush=True)
    result = {
        "n": args.n,
        "features": args.features,
        "listed_per_kind": args.listed,
        "register_s": took,
        "register_s_median": {k: statistics.median(v) for k, v in took.items()},
    }
    write_result("screening", result)
    print(result)


if __name__ == "__main__":
    main()
