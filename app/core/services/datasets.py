"""Reading datasets and their samples (registering them: app/core/services/registration.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.db.chunks import chunked
from app.core.db.tables import Dataset, Sample, utcnow
from app.core.errors import APIError, not_found
from app.core.identity import DatasetIds
from app.core.services import subject_tokens
from app.core.states import DatasetStatus, SampleStatus
from app.core.storage.crypto import Keyring, SampleRecord, open_sealed, sample_aad
from app.core.storage.keystore import wrapped_keys
from app.core.storage.sample_blocks import open_records


def get_dataset(session: Session, dataset_id: int) -> Dataset:
    ds = session.get(Dataset, dataset_id)
    if ds is None:
        raise not_found("dataset", dataset_id)
    return ds


def ready_dataset(session: Session, dataset_id: int) -> Dataset:
    """The dataset, 404 when unknown and 409 while it is registering or once it failed: a
    model or a deletion must see all its samples (app/core/services/registration.py)."""
    ds = get_dataset(session, dataset_id)
    if ds.status == DatasetStatus.registering:
        raise APIError(
            409,
            "dataset_registering",
            f"dataset {dataset_id} is still being registered; retry when its status is ready",
            {"dataset_id": dataset_id},
        )
    if ds.status == DatasetStatus.failed:
        raise APIError(
            409,
            "dataset_failed",
            f"dataset {dataset_id}'s registration failed; it holds no samples",
            {"dataset_id": dataset_id, "error": ds.error},
        )
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


SUMMARY_COLUMNS = (
    "id",
    "name",
    "kind",
    "source",
    "feature_shape",
    "n_classes",
    "n_samples",
    "status",
    "created_at",
)


def list_datasets(
    session: Session, *, status: str | None, offset: int, limit: int
) -> tuple[list[dict[str, Any]], int]:
    """A page of the datasets, newest first, and how many match: one indexed read of the
    datasets table, no count over their samples."""
    where = [] if status is None else [Dataset.status == status]
    total = session.scalar(select(func.count()).select_from(Dataset).where(*where)) or 0
    rows = session.scalars(
        select(Dataset).where(*where).order_by(Dataset.id.desc()).offset(offset).limit(limit)
    )
    return [dataset_summary(ds) for ds in rows], int(total)


def dataset_summary(ds: Dataset) -> dict[str, Any]:
    """What the list shows of a dataset: its columns and its progress (no count of rows)."""
    return {**{c: getattr(ds, c) for c in SUMMARY_COLUMNS}, "progress": progress_of(ds)}


def progress_of(ds: Dataset) -> dict[str, Any] | None:
    """A registering dataset's progress: rows committed, the total, the rate so far."""
    if ds.status != DatasetStatus.registering:
        return None
    elapsed = max((utcnow() - ds.created_at).total_seconds(), 1e-3)
    return {
        "rows_done": ds.rows_done,
        "rows_total": ds.n_samples,
        "rows_per_second": round(ds.rows_done / elapsed, 1),
    }


def dataset_view(session: Session, ds: Dataset) -> dict[str, Any]:
    """A dataset as `GET /v1/datasets/{id}` shows it: its summary and its counts. While it
    registers, its progress says how many rows are in: counting them on every poll took half a
    core from the registration it watched."""
    registering = ds.status == DatasetStatus.registering
    return {
        **dataset_summary(ds),
        "skipped_erased": ds.skipped_erased,
        "error": ds.error,
        "counts": None if registering else dataset_counts(session, ds.id),
        "text": None if ds.text is None else text_summary(ds.text),
        "ids": DatasetIds.of(ds).as_json(),
    }


def text_summary(meta: dict[str, Any]) -> dict[str, Any]:
    """A corpus's vocabulary size and counts (the words themselves appear as topics' top
    words on a topic model's versions)."""
    return {
        "vocabulary_size": len(meta["words"]),
        "rare_token": meta.get("rare_token"),
        "min_count": meta.get("min_count"),
        "documents_under_two_tokens": meta.get("documents_under_two_tokens", 0),
        "note": "documents with fewer than two tokens are kept but contribute nothing to the "
        "co-occurrence statistic (L(L − 1) = 0)",
    }


def list_samples(
    session: Session,
    ring: Keyring,
    dataset_id: int,
    *,
    split: str | None,
    status: str | None,
    subject: str | None,
    offset: int,
    limit: int,
    hide_erased: bool = False,
) -> tuple[list[dict[str, Any]], int]:
    """A page of samples with their ids and labels opened; an erased sample shows no ids and
    never matches a subject filter (its key, and with it its identity, is gone). With
    `hide_erased` (readers and requesters) erased rows are not listed at all: their place in
    upload order would say which row was erased; the dataset's counts still say
    how many."""
    get_dataset(session, dataset_id)
    query = select(Sample).where(Sample.dataset_id == dataset_id)
    if hide_erased:
        query = query.where(Sample.status != SampleStatus.erased)
    if split:
        query = query.where(Sample.split == split)
    if status:
        query = query.where(Sample.status == status)
    if subject:
        text = rules_of(session, dataset_id).form("subject").texts([subject], "subject")[0]
        token = ring.token("subject", dataset_id, text)
        query = query.where(
            Sample.id.in_(subject_tokens.samples_of(dataset_id, [token])),
            Sample.status != SampleStatus.erased,
        )
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Sample.id).offset(offset).limit(limit)).all()
    records = records_of(session, ring, rows)
    return [_sample_view(r, records.get(r.id)) for r in rows], total


def records_of(session: Session, ring: Keyring, rows: Sequence[Sample]) -> dict[int, SampleRecord]:
    """The sealed records of these samples (sealed in blocks or on their own), by sample id;
    an erased one (its key destroyed) is absent."""
    keys = wrapped_keys(session, [r.key_id for r in rows if r.key_id is not None])
    sealed = [SealedRow.of(r, keys.get(r.key_id) if r.key_id else None) for r in rows]
    records = open_records(session, ring, sealed)  # rows sealed in blocks
    for r in sealed:
        if r.wrapped is not None and r.payload is not None:  # rows sealed on their own
            aad = sample_aad(r.dataset_id, r.external_id)
            plain = open_sealed(ring.unwrap(r.wrapped), r.payload, aad)
            records[r.id] = SampleRecord.decode(plain)
    return records


def sample_ids_of(session: Session, ring: Keyring, sample_ids: Sequence[int]) -> list[str]:
    """The ids (as the dataset keeps them) of these samples, read from their sealed records:
    what a subject's erasure puts on the suppression list beside the subject."""
    out: list[str] = []
    for chunk in chunked(list(sample_ids)):
        rows = session.scalars(select(Sample).where(Sample.id.in_(chunk))).all()
        out += [r.external_id for r in records_of(session, ring, rows).values()]
    return out


def rules_of(session: Session, dataset_id: int) -> DatasetIds:
    """A dataset's rules for its ids (the defaults for one that does not exist: the caller
    answers 404 for it)."""
    row = session.get(Dataset, dataset_id)
    return DatasetIds() if row is None else DatasetIds.of(row)


@dataclass(frozen=True)
class SealedRow:
    """A sample row with its wrapped key, as `open_records` reads one."""

    id: int
    dataset_id: int
    external_id: str
    payload: bytes | None
    key_id: UUID | None
    wrapped: bytes | None
    block_row: int | None

    @classmethod
    def of(cls, row: Sample, wrapped: bytes | None) -> SealedRow:
        return cls(
            row.id, row.dataset_id, row.external_id, row.payload, row.key_id, wrapped, row.block_row
        )


def _sample_view(row: Sample, record: SampleRecord | None) -> dict[str, Any]:
    view: dict[str, Any] = {
        "external_id": None,
        "subject_id": None,
        "split": row.split,
        "label": None,
        "status": row.status,
        "erased_at": row.erased_at,
    }
    if record is not None:
        view |= {
            "external_id": record.external_id,
            "subject_id": record.subject_id,
            "label": record.label,
        }
    return view
