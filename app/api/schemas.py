"""JSON Schemas of what Lethe publishes, for auditors' own tools: no key needed (a schema
says nothing of anyone's data)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from app.api.responses import COMMON
from app.core.jsontypes import JsonObject
from app.core.ledger.certificate_body import SCHEMA_PATH, certificate_schema

router = APIRouter(tags=["audit"], responses=COMMON)  # as every router declares


@router.get(SCHEMA_PATH)
def certificate(request: Request) -> JsonObject:
    """The JSON Schema (draft 2020-12) of a deletion certificate's body, as the log signs it."""
    return certificate_schema(str(request.base_url).rstrip("/"))
