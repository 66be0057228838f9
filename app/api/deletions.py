"""Deletion requests: durable before acknowledged, idempotent by `Idempotency-Key`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from app.api.deps import DbDep, DeletionViewer, DispatcherDep, Requester
from app.dispatch import DELETE
from app.schemas import DeletionCreate, DeletionOut
from app.services.deletions import create_deletion, deletion_view, get_deletion

router = APIRouter(prefix="/v1/deletions", tags=["deletions"])


@router.post("", status_code=202, response_model=DeletionOut)
def create(
    body: DeletionCreate,
    key: Requester,
    db: DbDep,
    dispatcher: DispatcherDep,
    idempotency_key: Annotated[str | None, Header(max_length=180)] = None,
) -> Any:
    """Commit the request, then signal each affected model's worker; 202 with the request."""

    def accept(session: Session) -> tuple[DeletionOut, list[int], bool]:
        request, models, replayed = create_deletion(session, body, key.id, idempotency_key)
        return DeletionOut.model_validate(deletion_view(session, request)), models, replayed

    view, models, replayed = db.run(accept, retry_integrity=True)
    for model_id in models:
        dispatcher.enqueue(DELETE, model_id)
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    return JSONResponse(view.model_dump(mode="json"), status_code=202, headers=headers)


@router.get("/{request_id}", response_model=DeletionOut)
def read(request_id: int, _: DeletionViewer, db: DbDep) -> dict[str, Any]:
    with db.read() as session:
        return deletion_view(session, get_deletion(session, request_id))
