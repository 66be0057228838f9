"""Liveness, readiness (database and queue) and Prometheus metrics; no key needed."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from sqlalchemy import text

from app.api.deps import DbDep, DispatcherDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(db: DbDep, dispatcher: DispatcherDep) -> JSONResponse:
    checks = {"database": _db_ok(db), "queue": dispatcher.ping()}
    ready = all(checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


def _db_ok(db: DbDep) -> bool:
    try:
        with db.read() as session:
            session.execute(text("SELECT 1"))
        return True
    except Exception:
        return False


@router.get("/metrics")
def metrics(request: Request) -> Response:
    body = generate_latest(REGISTRY)
    with contextlib.suppress(Exception):  # database down: still serve the process metrics
        body += generate_latest(request.app.state.pipeline_registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
