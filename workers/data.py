"""Loading a model's training set and a dataset's test split from the database into tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.tables import Dataset, ModelSample, Sample


@dataclass
class Arrays:
    sample_ids: list[int]
    external_ids: list[str]
    X: torch.Tensor
    y: torch.Tensor
    subjects: list[str | None]

    def __len__(self) -> int:
        return len(self.sample_ids)


def _decode(rows: Sequence[Any], shape: list[int]) -> Arrays:
    n_feat = int(np.prod(shape)) if shape else 1
    X = np.empty((len(rows), n_feat), dtype=np.float32)
    for i, row in enumerate(rows):
        X[i] = np.frombuffer(row.payload, dtype=np.float32)
    return Arrays(
        sample_ids=[r.id for r in rows],
        external_ids=[r.external_id for r in rows],
        X=torch.from_numpy(X.reshape(len(rows), *shape)) if rows else torch.zeros((0, *shape)),
        y=torch.tensor([r.label for r in rows], dtype=torch.long),
        subjects=[r.subject_id for r in rows],
    )


def training_arrays(
    session: Session, model_id: int, dataset: Dataset, exclude: set[int] | None = None
) -> Arrays:
    """Samples the model still holds (ordered by id), minus `exclude`."""
    rows = session.execute(
        select(Sample.id, Sample.external_id, Sample.payload, Sample.label, Sample.subject_id)
        .join(ModelSample, ModelSample.sample_id == Sample.id)
        .where(ModelSample.model_id == model_id, ModelSample.removed_version_id.is_(None))
        .order_by(Sample.id)
    ).all()
    exclude = exclude or set()
    kept = [r for r in rows if r.id not in exclude]
    missing = [r.id for r in kept if r.payload is None]
    if missing:
        raise RuntimeError(f"payload of samples {missing[:10]} is gone but the model holds them")
    return _decode(kept, dataset.feature_shape)


def test_arrays(session: Session, dataset: Dataset) -> Arrays:
    rows = session.execute(
        select(Sample.id, Sample.external_id, Sample.payload, Sample.label, Sample.subject_id)
        .where(Sample.dataset_id == dataset.id, Sample.split == "test", Sample.payload.is_not(None))
        .order_by(Sample.id)
    ).all()
    return _decode(rows, dataset.feature_shape)


def arrays_for(session: Session, dataset: Dataset, sample_ids: list[int]) -> Arrays:
    """These samples in this order; erased payloads become zeros (for replays that exclude
    them anyway, like the coupled retrain)."""
    rows = {
        r.id: r
        for r in session.execute(
            select(
                Sample.id, Sample.external_id, Sample.payload, Sample.label, Sample.subject_id
            ).where(Sample.id.in_(sample_ids))
        )
    }
    shape = dataset.feature_shape
    n_feat = int(np.prod(shape)) if shape else 1
    X = np.zeros((len(sample_ids), n_feat), dtype=np.float32)
    y = np.zeros(len(sample_ids), dtype=np.int64)
    for i, sid in enumerate(sample_ids):
        row = rows.get(sid)
        if row is not None and row.payload is not None:
            X[i] = np.frombuffer(row.payload, dtype=np.float32)
            y[i] = row.label
    return Arrays(
        sample_ids=list(sample_ids),
        external_ids=[rows[s].external_id if s in rows else "" for s in sample_ids],
        X=torch.from_numpy(X.reshape(len(sample_ids), *shape)),
        y=torch.from_numpy(y),
        subjects=[rows[s].subject_id if s in rows else None for s in sample_ids],
    )
