"""The exception handlers that render every failure as {"error": {"code", "message", "details"}}.

A database or queue that cannot be reached is 503 with `Retry-After`, not 500: the handlers
cover the routes, and `DependencyGuard` (an ASGI middleware outside the other middlewares)
covers a middleware that reaches the database itself, such as the ingress key check.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DataError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import RETRY_AFTER_SECONDS, APIError, error_body
from app.core.storage.crypto import SealError
from app.core.storage.objects import BlobMissing, BlobStoreUnavailable

log = logging.getLogger("lethe.errors")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    410: "gone",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid",
}


class ErrorResponse(JSONResponse):
    """A JSON error that always renders: text the client sent that is not valid Unicode
    (a lone surrogate) is escaped instead of failing the response with a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(
                content, ensure_ascii=True, allow_nan=False, separators=(",", ":")
            ).encode("ascii")


def unavailable(exc: BaseException) -> tuple[str, str] | None:
    """(code, message) when `exc` means the database or the queue cannot be reached now
    (connection refused or lost, the database gone, a pool or lock timeout, a conflict still
    unresolved after the retries); None for anything else."""
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeoutError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return "database_unavailable", "the database cannot be reached; retry later"
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return "queue_unavailable", "the job queue cannot be reached; retry later"
    return None


def unavailable_response(code: str, message: str) -> ErrorResponse:
    return ErrorResponse(
        error_body(code, message), 503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
    )


def _log_unavailable(code: str, exc: BaseException) -> None:
    cause = getattr(exc, "orig", None) or exc
    first_line = next(iter(str(cause).splitlines()), "")
    log.warning("%s: %s: %s", code, type(cause).__name__, first_line)


class DependencyGuard:
    """503 with `Retry-After` for a database or queue error that escapes every handler (one
    raised in a middleware), as long as no response has started."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            found = unavailable(exc)
            if found is None or started:
                raise
            _log_unavailable(found[0], exc)
            await unavailable_response(*found)(scope, receive, send)


_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return allowed


async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    body = error_body(exc.code, exc.message, exc.details)
    return ErrorResponse(body, exc.status, headers=exc.headers)


async def _blob_missing(_: Request, exc: BlobMissing) -> JSONResponse:
    log.error("a committed blob is missing: %s", exc)
    message = "the stored bytes of this blob are missing from the object store"
    retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    return ErrorResponse(error_body("blob_missing", message), 503, headers=retry)


async def _blob_store(_: Request, exc: BlobStoreUnavailable) -> JSONResponse:
    log.warning("object store unavailable: %s", exc)
    body = error_body("blob_store_unavailable", "the object store is unavailable; retry")
    return ErrorResponse(body, 503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


async def _blob_corrupt(_: Request, exc: SealError) -> JSONResponse:
    log.error("sealed bytes do not open: %s", exc)
    message = "stored bytes failed their integrity check; nothing was served"
    return ErrorResponse(error_body("blob_corrupt", message), 500)


async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
    details = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")}
        for e in exc.errors()
    ]
    return ErrorResponse(error_body("invalid_request", "request validation failed", details), 422)


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405 and (methods := allowed_methods(request)):
        headers["Allow"] = ", ".join(methods)
    return ErrorResponse(
        error_body(code, str(exc.detail)), exc.status_code, headers=headers or None
    )


async def _data(_: Request, exc: DataError) -> JSONResponse:
    # The database refused a client value (e.g. an integer beyond BIGINT): bad input.
    return ErrorResponse(
        error_body("value_out_of_range", "a value is out of range for storage"), 422
    )


async def _overflow(_: Request, exc: OverflowError) -> JSONResponse:
    return ErrorResponse(error_body("value_out_of_range", "a number is too large"), 422)


async def _dependency(_: Request, exc: Exception) -> JSONResponse:
    found = unavailable(exc)
    if found is None:
        log.exception("unhandled error", exc_info=exc)
        return ErrorResponse(error_body("internal", "internal error"), 500)
    _log_unavailable(found[0], exc)
    return unavailable_response(*found)


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return ErrorResponse(error_body("internal", "internal error"), 500)


# Each error a request can meet and its answer; what is left is a 500 with nothing of it shown.
HANDLERS: tuple[tuple[type[Exception], Any], ...] = (
    (APIError, _api_error),
    (BlobMissing, _blob_missing),
    (BlobStoreUnavailable, _blob_store),
    (SealError, _blob_corrupt),
    (RequestValidationError, _validation),
    (StarletteHTTPException, _http),
    (DataError, _data),
    (OverflowError, _overflow),
    (DBAPIError, _dependency),
    (PoolTimeoutError, _dependency),
    (RedisConnectionError, _dependency),
    (RedisTimeoutError, _dependency),
    (Exception, _unexpected),
)


def install_error_handlers(app: FastAPI) -> None:
    """Every error as the API's JSON error body, with its status (docs/reference/api.md)."""
    for cls, handler in HANDLERS:
        app.exception_handler(cls)(handler)
