"""Reading and writing per-sample statistics (`sample_statistics` rows) as tensors."""

from __future__ import annotations

import numpy as np
import torch
from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from app.db.chunks import chunked
from app.db.tables import SampleStatistic
from workers.methods.base import StatisticsBlock

DTYPES = {"float32": np.float32, "float16": np.float16}
ROWS_PER_INSERT = 1000  # vectors are large: smaller insert batches bound the statement size


def write_block(
    session: Session, model_id: int, block: StatisticsBlock, replace: bool = False
) -> int:
    """Insert one row per vector (bulk); with `replace`, the model's old rows go first."""
    if replace:
        session.execute(delete(SampleStatistic).where(SampleStatistic.model_id == model_id))
    return _insert(session, model_id, block)


def delete_rows(session: Session, model_id: int, sample_ids: list[int]) -> None:
    """Delete these samples' statistics rows (consumed by an update)."""
    for chunk in chunked(sample_ids):
        session.execute(
            delete(SampleStatistic).where(
                SampleStatistic.model_id == model_id, SampleStatistic.sample_id.in_(chunk)
            )
        )


def _insert(session: Session, model_id: int, block: StatisticsBlock) -> int:
    vectors = block.vectors.detach().cpu().numpy().astype(DTYPES[block.dtype])
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1)
    for start in range(0, len(block.sample_ids), ROWS_PER_INSERT):
        rows = [
            {
                "model_id": model_id,
                "sample_id": block.sample_ids[i],
                "kind": block.kinds[i],
                "dtype": block.dtype,
                "norm": float(norms[i]),
                "vector": vectors[i].tobytes(),
            }
            for i in range(start, min(start + ROWS_PER_INSERT, len(block.sample_ids)))
        ]
        session.execute(insert(SampleStatistic), rows)
    return len(block.sample_ids)


def read_vectors(session: Session, model_id: int, sample_ids: list[int]) -> dict[int, torch.Tensor]:
    """The stored vectors of these samples (any kind), as float32 tensors."""
    out: dict[int, torch.Tensor] = {}
    for chunk in chunked(sample_ids):
        rows = session.execute(
            select(SampleStatistic.sample_id, SampleStatistic.dtype, SampleStatistic.vector).where(
                SampleStatistic.model_id == model_id, SampleStatistic.sample_id.in_(chunk)
            )
        )
        for sample_id, dtype, data in rows:
            out[sample_id] = torch.from_numpy(
                np.frombuffer(data, dtype=DTYPES[dtype]).astype(np.float32)
            )
    return out
