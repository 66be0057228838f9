"""Where a registration's time goes (issue 55, goal 6: "say how far from that limit and
where the time goes"), side by side in one run, in one process, on the embedded SQLite:

- `parse`: opening the Parquet bytes (`parse_parquet`: footer, schema checks, ids, labels);
- `read`: every row's features, label and id as the registration reads them (`ParquetRows`,
  a row group decoded at a time);
- `screen`: the suppression list's check (`suppression.screen`: a keyed token per id);
- `sample_tokens`: the rows' keyed tokens (`Keyring.tokens`, one HMAC each);
- `keys_and_seal`: the data keys made and wrapped and the records sealed, in both layouts
  side by side: `per_row`, a key per row (`sealed_row`: every registration before migration
  0025, every append before appends were sealed in blocks too), and `blocks`, a key per
  BLOCK_ROWS rows (`sealed_blocks`);
- `insert`: the keys', blocks' and rows' INSERTs and the chunk commits;
- `tokens`: the rows' id tokens into `sample_tokens`, last and sorted (blocks; a row sealed
  on its own writes its token with it, inside `insert`);
- `single_erasure_ms`: erasing one row afterwards, in each layout (in a block: the block
  opened, sealed again without the row under a new key, its rows moved to it);
- `register`: the real thing (`registration.register`, sealing and writing overlapped on two
  threads), in blocks and, its sealing and insert swapped for the per-row ones, as before.

The floor is writing the Parquet file's bytes to this disk (and fsync). Nothing here is a test.

    .venv/bin/python -m bench.registration_stages [--n 1000000] [--features 256]
        [--layouts per_row blocks]

Writes bench/results/registration_stages.json.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from uuid import UUID

import numpy as np
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db.migrate import upgrade_to_head
from app.db.tables import Dataset, Sample, utcnow
from app.runtime import Runtime
from app.services import registration, sample_tokens
from app.services.dataset_files import Limits, ParsedDataset
from app.services.parquet_files import Columns, parse_parquet
from app.services.suppression import screen
from app.settings import Settings
from app.storage.crypto import Keyring
from app.storage.erasure import erase_payloads
from app.storage.keystore import new_keys
from app.storage.sample_blocks import BLOCK_ROWS
from bench.common import write_result
from bench.registration import disk_floor, parquet_bytes


def timed(work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def fresh_runtime(root: Path, name: str, n: int, d: int) -> Runtime:
    settings = Settings(data_dir=root / name, max_dataset_cells=n * d, max_dataset_samples=n)
    upgrade_to_head(settings.resolved_database_url, settings)
    return Runtime.build(settings)


def parsed_of(data: bytes, settings: Settings) -> ParsedDataset:
    columns = Columns(label="label", id="id")
    return parse_parquet(data, columns, 0, 0.2, Limits.from_settings(settings))


def read_rows(parsed: ParsedDataset, start: int, stop: int) -> None:
    for i in range(start, stop):
        parsed.X[i].tobytes(), int(parsed.y[i]), parsed.ids[i]


def held(parsed: ParsedDataset, start: int, stop: int) -> ParsedDataset:
    """Rows `start:stop` as arrays in memory."""
    return replace(
        parsed,
        X=np.stack([parsed.X[i] for i in range(start, stop)]),
        y=np.asarray(parsed.y[start:stop]),
        ids=[parsed.ids[i] for i in range(start, stop)],
        subjects=list(parsed.subjects[start:stop]),
        split=list(parsed.split[start:stop]),
    )


def stages(runtime: Runtime, data: bytes, layout: str) -> dict[str, float]:
    """Each stage alone, a chunk at a time as the registration runs them, in sequence:
    `layout` "per_row" seals each row under a key of its own (every registration before
    migration 0025, every append before appends were sealed in blocks), "blocks"
    BLOCK_ROWS rows under one key."""
    ring = runtime.keyring
    out = dict.fromkeys(("read", "sample_tokens", "keys_and_seal", "insert"), 0.0)
    started = time.perf_counter()
    parsed = parsed_of(data, runtime.settings)  # the footer, the schema's checks, the ids
    out["parse"] = time.perf_counter() - started
    with runtime.db.read() as session:
        out["screen"] = timed(lambda: screen(session, ring, parsed.ids, parsed.subjects))
    with runtime.db.write() as session:
        dataset_id = registration.begin(session, "stages", "parquet")
    subjects = registration.SubjectTokens(ring, dataset_id)
    n = len(parsed.y)
    tokens = sample_tokens.SortedTokens()
    for start in range(0, n, registration.CHUNK):
        stop = min(start + registration.CHUNK, n)
        # the chunk's rows decoded (a row group at a time), then held as arrays for the
        # sealing (reading them again from the Parquet rows went back to the file's start)
        out["read"] += timed(lambda: read_rows(parsed, start, stop))  # noqa: B023
        part = held(parsed, start, stop)
        m = stop - start
        tokens_took = timed(lambda: ring.tokens("sample", dataset_id, part.ids))  # noqa: B023
        out["sample_tokens"] += tokens_took
        t = time.perf_counter()
        if layout == "blocks":
            chunk = registration.sealed_blocks(ring, dataset_id, part, range(m), subjects)
        else:
            keys = new_keys(ring, m)
            nonces = registration.Nonces(m)
            rows = [
                registration.sealed_row(
                    ring, dataset_id, part, i, raw, subjects, nonce=nonces.next()
                )
                for i, (_, raw, _) in zip(range(m), keys, strict=True)
            ]
        out["keys_and_seal"] += time.perf_counter() - t - tokens_took  # tokens counted above
        t = time.perf_counter()
        with runtime.db.write(durable=False) as session:
            if layout == "blocks":
                ids = registration._commit_chunk(session, ring, dataset_id, chunk, stop)
                tokens.add(chunk.tokens, ids)
            else:
                registration.insert_sealed(session, ring, dataset_id, keys, rows)
        out["insert"] += time.perf_counter() - t
    t = time.perf_counter()
    for pairs in tokens.chunks(registration.CHUNK):  # blocks: the tokens last, sorted
        with runtime.db.write(durable=False) as session:
            sample_tokens.insert_sorted(session.connection(), dataset_id, pairs)
    out["tokens"] = time.perf_counter() - t
    tokens.close()
    return out


def erasures_ms(runtime: Runtime, count: int = 20) -> list[float]:
    """`count` single-sample erasures, each its own transaction (`erase_payloads`: the key
    destroyed, and in a block the block sealed anew without the row), in ms."""
    with runtime.db.read() as session:
        ids = session.scalars(select(Sample.id).order_by(Sample.id).limit(count * 97)).all()
    took = []
    for sid in ids[::97][:count]:  # rows of different blocks
        with runtime.db.write() as session:
            started = time.perf_counter()
            assert erase_payloads(session, runtime.keyring, [sid]) == 1
            took.append((time.perf_counter() - started) * 1000)
    return took


def whole(runtime: Runtime, data: bytes, layout: str) -> float:
    """POST→ready's own work: parse, screen, seal and write, overlapped as the service does;
    `layout` "per_row" swaps in the sealing and insert of a key per row (`per_row_layout`)."""
    with runtime.db.write() as session:
        dataset_id = registration.begin(session, "whole", "parquet")
    started = time.perf_counter()
    parsed = parsed_of(data, runtime.settings)
    with per_row_layout() if layout == "per_row" else contextlib.nullcontext():
        registration.register(runtime, dataset_id, parsed)
    return time.perf_counter() - started


@dataclass
class PerRowChunk:
    """A chunk sealed a row at a time: each row's key, and its row in SAMPLE_COLUMNS order."""

    keys: list[tuple[UUID, bytes, bytes]]
    rows: list[list[Any]]

    @property
    def tokens(self) -> list[str]:
        return [row[registration.TOKEN] for row in self.rows]


@contextlib.contextmanager
def per_row_layout() -> Iterator[None]:
    """`registration.register` as it was before migration 0025: a data key per row, each row
    sealed on its own (`sealed_row`, `insert_sealed`: what an append still does)."""

    def sealed(
        ring: Keyring,
        dataset_id: int,
        parsed: ParsedDataset,
        positions: Sequence[int],
        subjects: registration.SubjectTokens,
    ) -> PerRowChunk:
        keys = new_keys(ring, len(positions))
        nonces = registration.Nonces(len(positions))
        rows = [
            registration.sealed_row(ring, dataset_id, parsed, i, raw, subjects, nonce=nonces.next())
            for i, (_, raw, _) in zip(positions, keys, strict=True)
        ]
        return PerRowChunk(keys, rows)

    def commit(
        session: Session, ring: Keyring, dataset_id: int, chunk: PerRowChunk, done: int
    ) -> list[int]:
        session.execute(
            update(Dataset)
            .where(Dataset.id == dataset_id)
            .values(progress_at=utcnow(), rows_done=done)
        )
        conn = session.connection()  # the tokens go in last, as a registration's do
        return registration.insert_sealed_rows(conn, ring, dataset_id, chunk.keys, chunk.rows)

    saved = registration.sealed_blocks, registration._commit_chunk
    registration.sealed_blocks, registration._commit_chunk = sealed, commit  # type: ignore[assignment]
    try:
        yield
    finally:
        registration.sealed_blocks, registration._commit_chunk = saved


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--row-group", type=int, default=65536)
    parser.add_argument("--layouts", nargs="+", default=["per_row", "blocks"])
    args = parser.parse_args()
    data = parquet_bytes(args.n, args.features, args.row_group)
    with tempfile.TemporaryDirectory(prefix="lethe-stages-") as scratch:
        root = Path(scratch)
        parts, erasing = {}, {}
        for layout in args.layouts:
            runtime = fresh_runtime(root, layout, args.n, args.features)
            parts[layout] = stages(runtime, data, layout)
            erasing[layout] = erasures_ms(runtime)
        register_s = {
            layout: whole(
                fresh_runtime(root, f"whole-{layout}", args.n, args.features), data, layout
            )
            for layout in args.layouts
        }
        floor = disk_floor(data, root)  # the Parquet file's bytes: as much as the features
    summed = {layout: sum(p.values()) for layout, p in parts.items()}
    result = {
        "n": args.n,
        "features": args.features,
        "block_rows": BLOCK_ROWS,
        "seconds": {k: {s: round(v, 3) for s, v in p.items()} for k, p in parts.items()},
        "per_row_us": {
            k: {s: round(v / args.n * 1e6, 2) for s, v in p.items()} for k, p in parts.items()
        },
        "stages_summed_s": {k: round(v, 3) for k, v in summed.items()},
        "register_s": {k: round(v, 3) for k, v in register_s.items()},
        "single_erasure_ms_p50": {k: round(statistics.median(v), 3) for k, v in erasing.items()},
        "single_erasure_ms": {k: [round(x, 3) for x in v] for k, v in erasing.items()},
        "disk_floor_s": round(floor, 3),
        "target_s": 20.0 * args.n / 1_000_000,
    }
    write_result("registration_stages", result)
    print(result)


if __name__ == "__main__":
    main()
