"""The error answers each route can give, declared in OpenAPI with the one error shape.

Every router declares `COMMON` (a key is missing or wrong, malformed input, the database is
unreachable); a route adds what it can answer beyond that with `errors(404, 409, ...)`.
Error bodies are always JSON, also on routes whose success is not (weights, export, metrics),
so the content type is named here rather than taken from the route's response class.
"""

from __future__ import annotations

from typing import Any

from app.core.errors import RETRY_AFTER_SECONDS

ERROR_SCHEMA: dict[str, Any] = {
    "title": "Error",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "details"],
            "properties": {
                "code": {"type": "string", "description": "stable, machine-readable"},
                "message": {"type": "string"},
                "details": {"description": "optional structured details (null when none)"},
            },
        }
    },
}

DESCRIPTIONS = {
    400: "Malformed request (e.g. an unreadable multipart body)",
    401: "No API key, or an unknown or revoked one",
    403: "The key's role may not do this",
    404: "Unknown id",
    409: "Conflicts with the current state",
    410: "Gone: erased",
    413: "Body or dataset too large",
    415: "Unsupported content type",
    416: "The byte range starts past the end (`Content-Range: bytes */<size>`)",
    422: "Invalid input",
    500: "Stored bytes failed their integrity check (`blob_corrupt`); nothing was served",
    503: "The database, the queue or the object store cannot be reached, a stored object "
    "is missing (`blob_missing`), or the database was restored from a backup and awaits "
    "`lethe restore` (`restore_required`, `restoring`); retry after `Retry-After` seconds",
}

RETRY_AFTER_HEADER = {
    "Retry-After": {
        "description": f"seconds to wait before retrying (currently {RETRY_AFTER_SECONDS})",
        "schema": {"type": "integer"},
        "required": True,
    }
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error status codes, each with the error schema."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in codes:
        response: dict[str, Any] = {
            "description": DESCRIPTIONS[code],
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
        if code == 503:
            response["headers"] = RETRY_AFTER_HEADER
        out[code] = response
    return out


# What any keyed route may answer: an unparsable body, no or a bad key, a wrong role, invalid
# parameters or body, a body over the size limit, the database unreachable.
COMMON = errors(400, 401, 403, 413, 422, 503)
