"""Client-facing errors and their one JSON shape, {"error": {"code", "message", "details"}}.

No web framework here: services raise these from worker processes too; the HTTP handlers
that render them live in app/api/errors.py.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import to_jsonable_python

from app.core.jsontypes import JsonObject


class APIError(Exception):
    """A client-facing error with an HTTP status, a stable code and optional details."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details
        self.headers = headers

    def as_json(self) -> dict[str, Any]:
        """The error as the API's body has it: status, code, message, details."""
        return {
            "status": self.status,
            "code": self.code,
            "message": self.message,
            "details": self.details,
        }


def not_found(what: str, ident: Any, **details: Any) -> APIError:
    return APIError(404, f"{what}_not_found", f"{what} {ident} does not exist", details or None)


def unprocessable(code: str, message: str, details: Any = None) -> APIError:
    return APIError(422, code, message, details)


def conflict(code: str, message: str, details: Any = None) -> APIError:
    return APIError(409, code, message, details)


# Seconds a client is told to wait (`Retry-After`) when the database or the queue is down.
RETRY_AFTER_SECONDS = 5


def error_body(code: str, message: str, details: Any = None) -> JsonObject:
    return {"error": {"code": code, "message": message, "details": to_jsonable_python(details)}}
