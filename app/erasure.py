"""Erasing a sample's payload once no live model holds it (DESIGN §6): the API calls it when a
request touches no model, the pipeline when a request's last model is done."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db.chunks import chunked
from app.db.session import rowcount
from app.db.tables import Model, ModelSample, Sample, utcnow
from app.states import ModelStatus, SampleStatus


def erase_payloads(session: Session, sample_ids: list[int]) -> int:
    """Erase features and labels of samples no live model still holds. Returns how many."""
    erased = 0
    for chunk in chunked(sample_ids):
        held = set(
            session.scalars(
                select(ModelSample.sample_id)
                .distinct()
                .join(Model, Model.id == ModelSample.model_id)
                .where(
                    ModelSample.sample_id.in_(chunk),
                    ModelSample.removed_version_id.is_(None),
                    Model.status != ModelStatus.failed,
                )
            )
        )
        free = [s for s in chunk if s not in held]
        if free:
            result = session.execute(
                update(Sample)
                .where(Sample.id.in_(free), Sample.status != SampleStatus.erased)
                .values(payload=None, label=None, status=SampleStatus.erased, erased_at=utcnow())
            )
            erased += rowcount(result) or 0
    return erased
