"""Lethe's typed Python client: `Client` and `AsyncClient` on httpx, the API's
answers as pydantic models (`lethe_client.wire`), errors as `LetheError` subclasses. Needs
httpx and pydantic only; the server uses the same wire models."""

from lethe_client.client import (
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    LetheError,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    Unreachable,
    UnsupportedMediaType,
)

__all__ = [
    "AsyncClient",
    "Client",
    "Conflict",
    "Forbidden",
    "Gone",
    "Invalid",
    "LetheError",
    "NotFound",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "UnsupportedMediaType",
]
