"""Registering datasets and reading their samples."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from app.db.tables import Dataset, Sample
from app.errors import not_found
from app.services.dataset_files import ParsedDataset
from app.states import SampleStatus

INSERT_CHUNK = 5000


def create_dataset(session: Session, name: str, source: str, parsed: ParsedDataset) -> Dataset:
    """Insert the dataset and all its samples (payload = float32 bytes) in one transaction."""
    ds = Dataset(
        name=name,
        kind=parsed.kind,
        source=source,
        feature_shape=list(parsed.X.shape[1:]),
        n_classes=parsed.n_classes,
        n_samples=len(parsed.y),
    )
    session.add(ds)
    session.flush()
    rows = [
        {
            "dataset_id": ds.id,
            "external_id": parsed.ids[i],
            "subject_id": parsed.subjects[i],
            "split": parsed.split[i],
            "payload": parsed.X[i].tobytes(),
            "label": int(parsed.y[i]),
            "status": SampleStatus.active,
        }
        for i in range(len(parsed.y))
    ]
    for start in range(0, len(rows), INSERT_CHUNK):
        session.execute(insert(Sample), rows[start : start + INSERT_CHUNK])
    return ds


def get_dataset(session: Session, dataset_id: int) -> Dataset:
    ds = session.get(Dataset, dataset_id)
    if ds is None:
        raise not_found("dataset", dataset_id)
    return ds


def dataset_counts(session: Session, dataset_id: int) -> dict[str, int]:
    """Samples per split and per status."""
    counts: dict[str, int] = {}
    for split, status, n in session.execute(
        select(Sample.split, Sample.status, func.count())
        .where(Sample.dataset_id == dataset_id)
        .group_by(Sample.split, Sample.status)
    ):
        counts[split] = counts.get(split, 0) + n
        counts[status] = counts.get(status, 0) + n
    return counts


def dataset_view(session: Session, ds: Dataset) -> dict[str, Any]:
    return {
        **{
            c: getattr(ds, c)
            for c in (
                "id",
                "name",
                "kind",
                "source",
                "feature_shape",
                "n_classes",
                "n_samples",
                "created_at",
            )
        },
        "counts": dataset_counts(session, ds.id),
    }


def list_samples(
    session: Session,
    dataset_id: int,
    *,
    split: str | None,
    status: str | None,
    subject: str | None,
    offset: int,
    limit: int,
) -> tuple[list[Sample], int]:
    get_dataset(session, dataset_id)
    query = select(Sample).where(Sample.dataset_id == dataset_id)
    if split:
        query = query.where(Sample.split == split)
    if status:
        query = query.where(Sample.status == status)
    if subject:
        query = query.where(Sample.subject_id == subject)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    items = session.scalars(query.order_by(Sample.id).offset(offset).limit(limit)).all()
    return list(items), total
