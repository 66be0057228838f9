"""The events Lethe announces and the outbox they go through: `emit` adds, in the
caller's transaction, one delivery row per enabled endpoint that wants the event, its body the
CloudEvents 1.0 structured JSON. No event without its commit, no commit without its event: the
rows commit or roll back with the change they announce. Payloads carry ids of requests,
models, versions, certificates and datasets, never a sample's or a subject's id."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from cloudevents.core.bindings.http import to_structured_event
from cloudevents.core.v1.event import CloudEvent
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.db.tables import DeletionRequest, DeletionTask, WebhookDelivery, WebhookEndpoint

DELETION_COMPLETED = "deletion.completed"
VERSION_PUBLISHED = "version.published"
AUDIT_COMPLETED = "audit.completed"
DATASET_READY = "dataset.ready"
MODEL_WITHDRAWN = "model.withdrawn"
EVENT_TYPES = (
    DELETION_COMPLETED,
    VERSION_PUBLISHED,
    AUDIT_COMPLETED,
    DATASET_READY,
    MODEL_WITHDRAWN,
)
TYPE_PREFIX = "dev.lethe."  # a CloudEvents type is reverse-DNS prefixed


def listening(session: Session, event_type: str) -> list[WebhookEndpoint]:
    """The enabled endpoints that want `event_type` (one query)."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown event type {event_type!r}")
    endpoints = session.scalars(
        select(WebhookEndpoint).where(WebhookEndpoint.disabled_at.is_(None))
    ).all()
    return [e for e in endpoints if not e.events or event_type in e.events]


def emit(
    session: Session,
    event_type: str,
    source: str,
    data: dict[str, Any] | Callable[[], dict[str, Any]],
    endpoints: list[WebhookEndpoint] | None = None,
) -> int:
    """Queue `event_type` about `source` (a path such as /models/3) for every enabled endpoint
    that wants it (`endpoints`, when the caller has them), in the caller's transaction; how
    many deliveries were queued. `data` may be a function, called only when some endpoint
    wants the event (no endpoint: one query)."""
    wanted = listening(session, event_type) if endpoints is None else endpoints
    if not wanted:
        return 0
    if callable(data):
        data = data()
    message_id = f"msg_{uuid.uuid4().hex}"
    event = CloudEvent(
        {
            "id": message_id,
            "type": TYPE_PREFIX + event_type,
            "source": f"/lethe{source}",
            "subject": source,
            "datacontenttype": "application/json",
        },
        data,
    )
    body = to_structured_event(event).body.decode()
    for endpoint in wanted:
        session.add(
            WebhookDelivery(
                endpoint_id=endpoint.id, message_id=message_id, event_type=event_type, body=body
            )
        )
    return len(wanted)


def deletion_completed(session: Session, request_ids: list[int]) -> None:
    """deletion.completed for each finished request: its status, per model the version and
    certificate, the receipts' URLs; never a sample's or a subject's id."""
    wanted = listening(session, DELETION_COMPLETED) if request_ids else []
    if not wanted:
        return  # one query for a whole batch of finished requests
    for request_id in request_ids:

        def data(request_id: int = request_id) -> dict[str, Any]:
            request = session.get(DeletionRequest, request_id)
            tasks = session.scalars(
                select(DeletionTask)
                .where(DeletionTask.request_id == request_id)
                .order_by(DeletionTask.model_id)
            ).all()
            certificates = [t.certificate_id for t in tasks if t.certificate_id is not None]
            return {
                "request_id": request_id,
                "status": str(request.status) if request is not None else None,
                "dataset_id": request.dataset_id if request is not None else None,
                "models": [
                    {
                        "model_id": t.model_id,
                        "status": str(t.status),
                        "certificate_id": t.certificate_id,
                        "samples_removed": t.n_removed,
                    }
                    for t in tasks
                ],
                "certificate_ids": certificates,
                "url": f"/v1/deletions/{request_id}",
                "receipts": [f"/v1/deletions/{request_id}/tlog-proofs/{c}" for c in certificates],
            }

        emit(session, DELETION_COMPLETED, f"/deletions/{request_id}", data, wanted)


def version_published(
    session: Session,
    model_id: int,
    number: int,
    kind: str,
    sha256: str,
    certificate_ids: list[int],
) -> None:
    """version.published: the model's new current version, its weights' SHA-256 and URL, and
    the certificates that came with it (none for a trained or imported version 1)."""
    emit(
        session,
        VERSION_PUBLISHED,
        f"/models/{model_id}/versions/{number}",
        {
            "model_id": model_id,
            "version": number,
            "kind": str(kind),
            "weights_sha256": sha256,
            "weights_url": f"/v1/models/{model_id}/versions/{number}/weights",
            "certificate_ids": certificate_ids,
        },
    )


def audit_completed(session: Session, audit_id: int, model_id: int, verdict: str | None) -> None:
    emit(
        session,
        AUDIT_COMPLETED,
        f"/audits/{audit_id}",
        {"audit_id": audit_id, "model_id": model_id, "verdict": verdict,
         "url": f"/v1/audits/{audit_id}"},
    )  # fmt: skip


def dataset_ready(session: Session, dataset_id: int) -> None:
    emit(
        session,
        DATASET_READY,
        f"/datasets/{dataset_id}",
        {"dataset_id": dataset_id, "url": f"/v1/datasets/{dataset_id}"},
    )


def model_withdrawn(session: Session, model_id: int, reason: str) -> None:
    emit(
        session,
        MODEL_WITHDRAWN,
        f"/models/{model_id}",
        {"model_id": model_id, "reason": reason, "url": f"/v1/models/{model_id}"},
    )
