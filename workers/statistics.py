"""Reading and writing per-sample statistics (`sample_statistics` rows) as tensors.

Each vector is sealed with its sample's data key (core/storage/crypto.py; a block's key for a row
sealed in one, which an erasure in the block moves to a new key with it): erasing the sample
destroys the key, so a statistic's bytes left in free space, WAL or backups can never be opened."""

from __future__ import annotations

from uuid import UUID

import numpy as np
import torch
from sqlalchemy import bindparam, delete, insert, select
from sqlalchemy.orm import Session

from app.core.db.chunks import chunked
from app.core.db.tables import Base, Sample, SampleStatistic
from app.core.storage.crypto import Keyring, open_sealed, seal, statistic_aad
from app.core.storage.keystore import load_keys
from methods.compute import StatisticsBlock

DTYPES = {"float32": np.float32, "float16": np.float16}
ROWS_PER_INSERT = 1000  # vectors are large: smaller insert batches bound the statement size


def write_block(
    session: Session, ring: Keyring, model_id: int, block: StatisticsBlock, replace: bool = False
) -> int:
    """Insert one row per vector (bulk); with `replace`, the model's old rows go first."""
    if replace:
        session.execute(delete(SampleStatistic).where(SampleStatistic.model_id == model_id))
    return _insert(session, ring, model_id, block)


_STATISTICS = Base.metadata.tables["sample_statistics"]
_DELETE = delete(_STATISTICS).where(  # built once
    _STATISTICS.c.model_id == bindparam("model_id"),
    _STATISTICS.c.sample_id.in_(bindparam("ids", expanding=True)),
)


def delete_rows(session: Session, model_id: int, sample_ids: list[int]) -> None:
    """Delete these samples' statistics rows (consumed by an update)."""
    conn = session.connection()
    for chunk in chunked(sample_ids):
        conn.execute(_DELETE, {"model_id": model_id, "ids": chunk})


def _insert(session: Session, ring: Keyring, model_id: int, block: StatisticsBlock) -> int:
    vectors = block.vectors.detach().cpu().numpy().astype(DTYPES[block.dtype])
    for start in range(0, len(block.sample_ids), ROWS_PER_INSERT):
        stop = min(start + ROWS_PER_INSERT, len(block.sample_ids))
        keys = sample_keys(session, ring, block.sample_ids[start:stop])
        rows = []
        for i in range(start, stop):
            sid, kind = block.sample_ids[i], block.kinds[i]
            if sid not in keys:
                raise RuntimeError(f"sample {sid} is erased: its statistic cannot be stored")
            sealed = seal(keys[sid], vectors[i].tobytes(), statistic_aad(model_id, sid, kind))
            rows.append(
                {
                    "model_id": model_id,
                    "sample_id": sid,
                    "kind": kind,
                    "dtype": block.dtype,
                    "vector": sealed,
                }
            )
        session.execute(insert(SampleStatistic), rows)
    return len(block.sample_ids)


def sample_keys(session: Session, ring: Keyring, sample_ids: list[int]) -> dict[int, bytes]:
    """The raw data keys of these samples (erased samples are absent)."""
    by_sample: dict[int, UUID] = {}
    for chunk in chunked(sample_ids):
        for sid, key_id in session.execute(
            select(Sample.id, Sample.key_id).where(Sample.id.in_(chunk))
        ):
            if key_id is not None:
                by_sample[sid] = key_id
    keys = load_keys(session, ring, list(by_sample.values()))
    return {sid: keys[kid] for sid, kid in by_sample.items() if kid in keys}


def read_vectors(
    session: Session, ring: Keyring, model_id: int, sample_ids: list[int]
) -> dict[int, torch.Tensor]:
    """The stored vectors of these samples (any kind), as float32 tensors."""
    out: dict[int, torch.Tensor] = {}
    keys = sample_keys(session, ring, sample_ids)
    for chunk in chunked(sample_ids):
        rows = session.execute(
            select(
                SampleStatistic.sample_id,
                SampleStatistic.kind,
                SampleStatistic.dtype,
                SampleStatistic.vector,
            ).where(SampleStatistic.model_id == model_id, SampleStatistic.sample_id.in_(chunk))
        )
        for sample_id, kind, dtype, sealed in rows:
            plain = open_sealed(keys[sample_id], sealed, statistic_aad(model_id, sample_id, kind))
            out[sample_id] = torch.from_numpy(
                np.frombuffer(plain, dtype=DTYPES[dtype]).astype(np.float32)
            )
    return out
