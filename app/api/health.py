"""Liveness and readiness (no key), and Prometheus metrics (access per LETHE_METRICS_ACCESS)."""

from __future__ import annotations

import contextlib
import secrets

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from app.api.deps import DbDep, DispatcherDep, SettingsDep, require
from app.api.responses import errors
from app.core.dispatch import Dispatcher
from app.core.errors import APIError
from app.core.security import Role
from app.core.wire import HealthOut

router = APIRouter(tags=["health"])

READY_SCHEMA = {
    "type": "object",
    "required": ["ready", "checks"],
    "properties": {
        "ready": {"type": "boolean"},
        "checks": {
            "type": "object",
            "properties": {
                "database": {"type": "boolean"},
                "queue": {"type": "boolean"},
                "restore": {"type": "boolean"},
            },
        },
    },
}


@router.get("/healthz", response_model=HealthOut)
def healthz() -> HealthOut:
    return HealthOut(status="ok")


@router.get(
    "/readyz",
    responses={
        200: {"content": {"application/json": {"schema": READY_SCHEMA}}},
        503: {
            "description": "The database or the queue cannot be reached",
            "content": {"application/json": {"schema": READY_SCHEMA}},
        },
    },
)
def readyz(request: Request, db: DbDep, dispatcher: DispatcherDep) -> JSONResponse:
    checks = {"database": _db_ok(db), "queue": dispatcher.ping()}
    body: dict[str, object] = {}
    if checks["database"]:  # not ready while behind the restore journal
        restore = request.app.state.restore_gate.check()
        checks["restore"] = restore.state == "ok"
        if restore.state != "ok":
            body["restore"] = {"state": restore.state, "reason": restore.reason}
    ready = all(checks.values())
    return JSONResponse(
        {"ready": ready, "checks": checks, **body}, status_code=200 if ready else 503
    )


def _db_ok(db: DbDep) -> bool:
    try:
        with db.read() as session:
            session.execute(text("SELECT 1"))
        return True
    except Exception:
        return False


_metrics_key = require(Role.auditor)  # an admin or auditor key


async def check_metrics_access(request: Request, settings: SettingsDep, db: DbDep) -> None:
    """LETHE_METRICS_ACCESS: `key` (admin or auditor API key), `token` (the scraper's
    LETHE_METRICS_TOKEN as Bearer), `public`, or `off` (404, as if there were no route)."""
    mode = settings.metrics_access
    if mode == "public":
        return
    if mode == "off":
        raise APIError(404, "not_found", "Not Found")
    if mode == "key":
        await _metrics_key(request, db)
        return
    expected = settings.metrics_token.get_secret_value() if settings.metrics_token else ""
    scheme, _, raw = request.headers.get("authorization", "").partition(" ")
    if not (
        expected
        and scheme.lower() == "bearer"
        and secrets.compare_digest(raw.strip().encode(), expected.strip().encode())
    ):
        raise APIError(
            401, "unauthorized", "send the metrics token: 'Authorization: Bearer <token>'"
        )


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {
            "description": "Prometheus text exposition format",
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
        },
        **errors(401, 403, 404, 503),
    },
)
async def metrics(request: Request, settings: SettingsDep, db: DbDep) -> PlainTextResponse:
    """Prometheus metrics; who may read them is LETHE_METRICS_ACCESS (default: an admin or
    auditor API key)."""
    await check_metrics_access(request, settings, db)
    state = request.app.state
    body = await run_in_threadpool(_exposition, state.pipeline_registry, state.dispatcher)
    return PlainTextResponse(body, media_type=CONTENT_TYPE_LATEST)


def _exposition(pipeline: CollectorRegistry, dispatcher: Dispatcher) -> bytes:
    """The process's metrics, an embedded worker process's counters, then the pipeline's
    (read from the database: in a thread)."""
    body = generate_latest(REGISTRY) + dispatcher.metrics()
    with contextlib.suppress(Exception):  # database down: still serve the process metrics
        body += generate_latest(pipeline)
    return body
