"""The cost of crypto-shredding on SQLite and PostgreSQL.

For n samples of d float32 features: registering a dataset sealed (one data key per sample,
AES-256-GCM) against inserting the same features in plaintext as before; opening every
payload for a training load against reading plaintext; the bytes each sample costs; and the
compaction an erasure triggers (SQLite WAL checkpoint, PostgreSQL VACUUM FULL data_keys).

    .venv/bin/python -m bench.erasure [--n 100000] [--d 64]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from sqlalchemy import insert, select

from app.core.db.migrate import upgrade_to_head
from app.core.db.session import engine_for
from app.core.db.tables import Dataset, Sample
from app.core.formats.dataset_files import ParsedDataset
from app.core.runtime import Runtime
from app.core.services.registration import register
from app.core.settings import Settings
from app.core.storage.erasure import compact, erase_payloads
from bench.common import scratch_database, write_result
from workers.data import _decode, sealed_samples


def parsed_dataset(n: int, d: int) -> ParsedDataset:
    rng = np.random.default_rng(0)
    return ParsedDataset(
        X=rng.normal(size=(n, d)).astype(np.float32),
        y=rng.integers(0, 10, n),
        ids=[f"user-{i}" for i in range(n)],
        subjects=[f"subject-{i // 4}" for i in range(n)],
        split=["train"] * n,
        n_classes=10,
        kind="tabular",
    )


def measure(url: str, folder: Path, parsed: ParsedDataset, erase: int) -> dict[str, float | int]:
    runtime = Runtime.build(Settings(data_dir=folder, database_url=url))
    db = runtime.db
    n, d = parsed.X.shape
    t0 = time.perf_counter()
    sealed_id = register(runtime, "sealed", "bench", parsed)
    register_sealed = time.perf_counter() - t0

    t0 = time.perf_counter()  # what registering cost before: plaintext rows, no keys
    with db.write() as session:
        plain = Dataset(
            name="plain", kind="tabular", source="bench", feature_shape=[d], n_classes=10,
            n_samples=n,
        )  # fmt: skip
        session.add(plain)
        session.flush()
        for start in range(0, n, 5000):
            session.execute(
                insert(Sample),
                [
                    {
                        "dataset_id": plain.id,
                        "external_id": parsed.ids[i],
                        "subject_id": parsed.subjects[i],
                        "split": "train",
                        "payload": parsed.X[i].tobytes(),
                        "status": "active",
                    }
                    for i in range(start, min(start + 5000, n))
                ],
            )
    register_plain = time.perf_counter() - t0

    with db.read() as session:
        t0 = time.perf_counter()
        rows = session.execute(
            sealed_samples().where(Sample.dataset_id == sealed_id).order_by(Sample.id)
        ).all()
        arrays = _decode(rows, [d])
        load_sealed = time.perf_counter() - t0
        assert np.array_equal(arrays.X.numpy(), parsed.X)
        t0 = time.perf_counter()
        prow = session.execute(
            select(Sample.id, Sample.payload).where(Sample.dataset_id == plain.id)
        ).all()
        X = np.empty((len(prow), d), dtype=np.float32)
        for i, r in enumerate(prow):
            X[i] = np.frombuffer(r.payload, dtype=np.float32)
        load_plain = time.perf_counter() - t0
        payload_sealed = len(rows[0].payload)
        ids = [r.id for r in rows[:erase]]

    t0 = time.perf_counter()
    with db.write() as session:
        erased = erase_payloads(session, ids)
    erase_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    compact(db)
    compact_seconds = time.perf_counter() - t0
    assert erased == erase
    return {
        "register_sealed_s": register_sealed,
        "register_plain_s": register_plain,
        "load_sealed_s": load_sealed,
        "load_plain_s": load_plain,
        "payload_bytes_sealed": payload_sealed,
        "payload_bytes_plain": d * 4,
        "erase_s": erase_seconds,
        "compaction_s": compact_seconds,
        "samples_erased": erased,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--d", type=int, default=64)
    parser.add_argument("--erase", type=int, default=100)
    args = parser.parse_args()
    parsed = parsed_dataset(args.n, args.d)
    results: dict[str, object] = {"n": args.n, "d": args.d}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        upgrade_to_head(url)
        results["sqlite"] = measure(url, Path(tmp), parsed, args.erase)
        engine_for(url).dispose()

        with scratch_database() as pg:
            results["postgresql"] = measure(pg, Path(tmp), parsed, args.erase)
            with engine_for(pg).connect() as conn:
                results["postgresql"]["data_keys_bytes"] = conn.execute(  # type: ignore[index]
                    sa.text("SELECT pg_total_relation_size('data_keys')")
                ).scalar_one()
    for backend in ("sqlite", "postgresql"):
        print(backend, results[backend])
    write_result("erasure", results)


if __name__ == "__main__":
    main()
