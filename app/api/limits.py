"""The ingress gate: a key before any body is read, and a byte limit while the body streams.

A pure ASGI middleware, so that it sees the body as it arrives (chunked or not) and can stop
it there; Starlette's BaseHTTPMiddleware cannot answer in the middle of a body.

* A request that carries a body (a Content-Length above 0 or a Transfer-Encoding) with a
  method other than GET/HEAD/OPTIONS/TRACE needs a known, unrevoked key in
  `Authorization: Bearer <key>`; else 401 before one byte of the body is read. Every route
  that takes a body also requires a key, so no client loses anything; the role check stays
  with the route's dependency.
* Every request body is counted as it streams. Multipart uploads to the upload routes may
  hold `max_upload_bytes` (plus room for the multipart framing); every other body
  `max_json_bytes`. A Content-Length above the limit is refused up front; a body that
  passes the limit while streaming is answered 413 at once, and the application sees the
  client disconnect.

Early answers carry `Connection: close`: the unread rest of the body is not drained.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from starlette.datastructures import Headers, UploadFile
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.keycache import KeyCache
from app.core.errors import error_body

BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
UPLOAD_ROUTES = frozenset({"/v1/datasets", "/v1/models/import"})
APPEND_ROUTE = re.compile(r"/v1/datasets/[0-9]+/samples")  # an append's upload
MULTIPART_SLACK = 64 * 1024  # boundaries, part headers and the small form fields
VERIFIED_KEY = "lethe_verified_key"  # request.state: (raw key, ApiKey) the gate looked up


def route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path.rstrip("/") or "/"


class IngressLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_json_bytes: int,
        max_upload_bytes: int,
        upload_routes: Collection[str] = UPLOAD_ROUTES,
    ) -> None:
        self.app = app
        self.max_json_bytes = max_json_bytes
        self.max_upload_bytes = max_upload_bytes
        self.upload_routes = frozenset(upload_routes)

    def limit(self, scope: Scope, headers: Headers) -> tuple[int, str]:
        """The byte limit of this request's body and the message that names it."""
        is_upload = (
            scope["method"] == "POST"
            and (
                route_path(scope) in self.upload_routes
                or APPEND_ROUTE.fullmatch(route_path(scope)) is not None
            )
            and headers.get("content-type", "").startswith("multipart/form-data")
        )
        if is_upload:
            return (
                self.max_upload_bytes + MULTIPART_SLACK,
                f"uploads are limited to {self.max_upload_bytes} bytes",
            )
        return self.max_json_bytes, f"request bodies are limited to {self.max_json_bytes} bytes"

    async def authenticate(self, scope: Scope, headers: Headers) -> str | None:
        """None when the request carries a valid key, else why not."""
        scheme, _, raw = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            return "missing API key: send 'Authorization: Bearer <key>'"
        cache: KeyCache = scope["app"].state.key_cache
        key = await cache.verified(raw.strip())
        if key is None:
            return "invalid or revoked API key"
        # The route's dependency checks the role of this same key without a second lookup.
        scope.setdefault("state", {})[VERIFIED_KEY] = (raw.strip(), key)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        length = headers.get("content-length", "").strip()
        declared = int(length) if length.isdigit() else None
        has_body = "transfer-encoding" in headers or bool(declared)

        if has_body and scope["method"] not in BODYLESS_METHODS:
            problem = await self.authenticate(scope, headers)
            if problem is not None:
                await reject(send, 401, "unauthorized", problem)
                return

        limit, message = self.limit(scope, headers)
        if declared is not None and declared > limit:
            await reject(send, 413, "payload_too_large", message, {"limit_bytes": limit})
            return

        metered = _Metered(receive, send, limit, message)
        try:
            await self.app(scope, metered.receive, metered.send)
        except Exception:
            if not metered.answered:  # after our 413 the app's ClientDisconnect is expected
                raise


async def reject(send: Send, status: int, code: str, message: str, details: object = None) -> None:
    response = JSONResponse(
        error_body(code, message, details), status, headers={"connection": "close"}
    )
    await send({"type": "http.response.start", "status": status, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


async def read_upload(upload: UploadFile, limit: int) -> bytes:
    """An uploaded file's bytes, at most `limit` + 1 of them (more than `limit` is the
    caller's 413). The read asks for the spooled file's size, not for `limit` + 1: under the
    allocator that fills what it hands out (app/core/allocator.py) a buffer of the upload
    limit is filled in full, on every registration's and append's request path."""
    size = upload.size if upload.size is not None else limit
    return await upload.read(min(size, limit) + 1)


class _Metered:
    """One request's body, counted as it arrives: past `limit` bytes a 413 is answered (where
    the application has not started its own answer) and the application sees a disconnect."""

    def __init__(self, receive: Receive, send: Send, limit: int, message: str) -> None:
        self._receive, self._send, self.limit, self.message = receive, send, limit, message
        self.received = 0
        self.started = False  # the application has started its response
        self.answered = False  # a 413 was answered in the middle of the body

    async def receive(self) -> Message:
        if self.answered:
            return {"type": "http.disconnect"}
        message_in = await self._receive()
        if message_in["type"] == "http.request":
            self.received += len(message_in.get("body", b""))
            if self.received > self.limit:
                if not self.started:
                    self.answered = True
                    details = {"limit_bytes": self.limit}
                    await reject(self._send, 413, "payload_too_large", self.message, details)
                return {"type": "http.disconnect"}
        return message_in

    async def send(self, message_out: Message) -> None:
        if self.answered:  # the application's own answer to the disconnect goes nowhere
            return
        if message_out["type"] == "http.response.start":
            self.started = True
        await self._send(message_out)
