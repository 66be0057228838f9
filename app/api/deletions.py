"""Deletion requests: durable before acknowledged, idempotent by `Idempotency-Key`."""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from app.api.deps import (
    CommitterDep,
    DbDep,
    DeletionViewer,
    DispatcherDep,
    Requester,
    RuntimeDep,
    SettingsDep,
)
from app.api.long_poll import MAX_WAIT_SECONDS, long_poll, wait_query
from app.api.params import PathId
from app.api.responses import COMMON, errors
from app.core import wakeups
from app.core.jsontypes import JsonObject
from app.core.schemas import DeletionCreate, DeletionOut, DeletionPage
from app.core.services.acceptance import accept
from app.core.services.deletions import (
    deletion_view,
    get_deletion,
    list_deletions,
    tlog_proof_of,
)
from app.core.states import FINISHED_REQUEST

log = logging.getLogger("lethe.api")

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


PreferHeader = Annotated[
    str | None,
    Header(
        description="RFC 7240: `wait=N` answers when the request is done or failed, or "
        f"after N seconds (at most {MAX_WAIT_SECONDS:.0f}) with its status then.",
    ),
]


@router.post(
    "",
    status_code=202,
    response_model=DeletionOut,
    responses={
        200: {"description": "done or failed within the `Prefer: wait` asked for"},
        **errors(404, 409),
    },
)
async def create(
    body: Annotated[DeletionCreate, Body(openapi_examples=DELETION_EXAMPLES)],
    key: Requester,
    db: DbDep,
    runtime: RuntimeDep,
    committer: CommitterDep,
    dispatcher: DispatcherDep,
    request: Request,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=180)] = None,
    prefer: PreferHeader = None,
) -> Any:
    """Commit the request (in the next group commit), then signal each affected model's
    worker; 202 with the request. With `Prefer: wait=N` the answer waits, as a long poll of
    the request does, until it is finished (200, with its certificates and receipts) or N
    seconds have passed (202): one round trip from request to certificate."""

    wait = preferred_wait(prefer)
    woken = wakeups.FINISHED.register() if wait else None  # before the commit: none is lost
    try:  # in the thread pool, as a sync route runs
        done = await run_in_threadpool(
            accept, runtime, committer, dispatcher, body, key, idempotency_key
        )
    except BaseException:
        if woken is not None:
            wakeups.FINISHED.forget(woken)
        raise
    view, names = done.view, done.names
    headers = {"Idempotent-Replayed": "true"} if done.replayed else {}
    if woken is None:
        return JSONResponse(view.model_dump(mode="json"), status_code=202, headers=headers)
    opening = bytes.fromhex(view.opening) if view.opening else None

    def again() -> JsonObject:  # as its sender sees it: its own ids, its opening
        with db.read() as session:
            found = get_deletion(session, view.id, key)
            return deletion_view(session, found, names, receipts=True, opening=opening)

    accepted = view.model_dump(mode="json")
    try:
        current = await long_poll(again, _finished, request, wait, accepted, woken)
    except Exception:  # the request is durable: say so (202), not that the POST failed
        log.warning("deletion %s: waiting for it failed; answering 202", view.id, exc_info=True)
        wakeups.FINISHED.forget(woken)
        return JSONResponse(accepted, status_code=202, headers=headers)
    headers["Preference-Applied"] = f"wait={wait:g}"
    status = 200 if current["status"] in FINISHED_REQUEST else 202
    out = DeletionOut.model_validate(current).model_dump(mode="json")
    return JSONResponse(out, status_code=status, headers=headers)


def _finished(view: JsonObject) -> bool:
    return view["status"] in FINISHED_REQUEST


_PREFER_WAIT = re.compile(r'(?:^|[,;])\s*wait\s*=\s*"?(\d{1,9})"?\s*(?:$|[,;])', re.IGNORECASE)


def preferred_wait(prefer: str | None) -> float:
    """The `wait` preference of a Prefer header (RFC 7240 §4.3: delta-seconds), capped at
    MAX_WAIT_SECONDS; 0 without one. A preference it cannot read is ignored, as the RFC asks."""
    found = _PREFER_WAIT.search(prefer or "")
    return min(float(found.group(1)), MAX_WAIT_SECONDS) if found else 0.0


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
    wait: Annotated[float, wait_query("the request is done or failed")] = 0,
) -> JsonObject:
    """A requester sees only its own requests; auditors and admins see all. With `wait`, the
    answer comes when the request finishes: a worker's commit wakes the wait (app/core/wakeups.py),
    and a look every 50–250 ms (250 ms while wake-ups are dependable) covers a lost wake-up,
    so a client learns of its certificate without polling."""

    def view() -> JsonObject:
        with db.read() as session:
            request = get_deletion(session, request_id, key)
            return deletion_view(session, request, receipts=True)

    return await long_poll(view, _finished, request, wait)


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
