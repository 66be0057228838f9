"""Deletion requests: durable before acknowledged, idempotent by `Idempotency-Key`."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app import wakeups
from app.api.deps import (
    CommitterDep,
    DbDep,
    DeletionViewer,
    DispatcherDep,
    Requester,
    SettingsDep,
)
from app.api.params import PathId
from app.api.responses import COMMON, errors
from app.dispatch import DELETE
from app.jsontypes import JsonObject
from app.schemas import DeletionCreate, DeletionOut, DeletionPage
from app.security import Role
from app.services.deletions import (
    Names,
    create_deletion,
    deletion_view,
    get_deletion,
    list_deletions,
    tlog_proof_of,
)
from app.states import FINISHED_REQUEST
from app.storage.erasure import compact_after_erasure

MAX_WAIT_SECONDS = 30.0

router = APIRouter(prefix="/v1/deletions", tags=["deletions"], responses=COMMON)


DELETION_EXAMPLES: JsonObject = {
    "samples": {
        "summary": "forget three samples",
        "value": {"dataset_id": 1, "sample_ids": ["17", "42", "1001"]},
    },
    "subject": {
        "summary": "forget everything of a data subject",
        "value": {"dataset_id": 2, "subject_ids": ["person-7"]},
    },
    "tighter": {
        "summary": "a tighter target than the policy, or an exact retrain",
        "value": {"dataset_id": 1, "sample_ids": ["17"], "epsilon": 0.5, "method": "retrain"},
    },
}


@router.post("", status_code=202, response_model=DeletionOut, responses=errors(404, 409))
def create(
    body: Annotated[DeletionCreate, Body(openapi_examples=DELETION_EXAMPLES)],
    key: Requester,
    db: DbDep,
    committer: CommitterDep,
    dispatcher: DispatcherDep,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=180)] = None,
) -> Any:
    """Commit the request (in the next group commit), then signal each affected model's
    worker; 202 with the request."""

    names = Names.of(body)  # keyed tokens of the ids: computed once, outside the transaction

    def accept(session: Session) -> tuple[DeletionOut, list[int], bool]:
        accepted = create_deletion(
            session, body, names, key.id, idempotency_key, key.role == Role.admin
        )
        view = deletion_view(
            session, accepted.request, names, new_tasks=accepted.tasks, opening=accepted.opening
        )
        return DeletionOut.model_validate(view), accepted.models, accepted.replayed

    def signal(accepted: tuple[DeletionOut, list[int], bool]) -> None:
        for model_id in accepted[1]:
            dispatcher.enqueue(DELETE, model_id)

    view, _, replayed = committer.submit(accept, after=signal)
    if view.status == "done" and not replayed:  # nothing held them: erased on acceptance
        compact_after_erasure(db)
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    return JSONResponse(view.model_dump(mode="json"), status_code=202, headers=headers)


@router.get("", response_model=DeletionPage)
def list_requests(
    key: DeletionViewer,
    db: DbDep,
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> DeletionPage:
    """Deletion requests, newest first: a requester's own, every one for auditors and admins."""
    with db.read() as session:
        items = list_deletions(session, key, offset, limit)
    return DeletionPage.model_validate({"items": items, "offset": offset, "limit": limit})


@router.get("/{request_id}", response_model=DeletionOut, responses=errors(404))
async def read(
    request_id: PathId,
    key: DeletionViewer,
    db: DbDep,
    request: Request,
    wait: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_SECONDS,
            description="Long poll: answer as soon as the request is done or failed, or "
            "after this many seconds with its status then.",
        ),
    ] = 0,
) -> JsonObject:
    """A requester sees only its own requests; auditors and admins see all. With `wait`, the
    answer comes when the request finishes: a worker's commit wakes the wait (app/wakeups.py),
    and a look every 50–250 ms (250 ms while wake-ups are dependable) covers a lost wake-up,
    so a client learns of its certificate without polling."""

    def view() -> JsonObject:
        with db.read() as session:
            request = get_deletion(session, request_id, key)
            return deletion_view(session, request, receipts=True)

    deadline = time.monotonic() + wait
    pause = wakeups.FINISHED.first_look_seconds()
    while True:
        woken = wakeups.FINISHED.register()  # before the read: no wake-up falls in between
        current = await run_in_threadpool(view)
        if current["status"] in FINISHED_REQUEST or time.monotonic() >= deadline:
            wakeups.FINISHED.forget(woken)
            return current
        if await request.is_disconnected():  # nobody is waiting: stop reading the database
            wakeups.FINISHED.forget(woken)
            return current
        await wakeups.wait(woken, min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, 0.25)


@router.get(
    "/{request_id}/tlog-proofs/{certificate_id}",
    response_class=Response,
    responses={
        200: {
            "description": "a C2SP tlog-proof@v1 file (`.tlog-proof`), checkable offline",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        },
        **errors(404, 409),
    },
)
def tlog_proof(
    request_id: PathId,
    certificate_id: PathId,
    key: DeletionViewer,
    db: DbDep,
    settings: SettingsDep,
) -> Response:
    """One certificate of this request as a `.tlog-proof`: the certificate (its `extra` line),
    its index and inclusion proof, and the published checkpoint with the witnesses'
    cosignatures. `lethe audit verify-receipt FILE --policy POLICY` checks it offline."""
    text = tlog_proof_of(db, settings, request_id, certificate_id, key)
    filename = f"lethe-certificate-{certificate_id}.tlog-proof"
    return Response(
        text,
        media_type="text/plain; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
