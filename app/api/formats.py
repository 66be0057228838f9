"""The data formats an upload or an object may be in (app/core/formats): each one's name,
suffixes and options as a JSON Schema, for the dashboard's file picker and for clients."""

from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import AnyRole
from app.api.responses import COMMON
from app.core import formats
from app.core.jsontypes import JsonObject

router = APIRouter(prefix="/v1/formats", tags=["datasets"], responses=COMMON)


@router.get("")
def list_formats(_: AnyRole) -> list[JsonObject]:
    """Every format, with the options its upload form (or object source) takes."""
    return [
        {
            "name": f.name,
            "summary": f.summary,
            "suffixes": list(f.suffixes),
            "from_objects": f.from_objects,
            "options": f.options.model_json_schema(),
        }
        for f in formats.FORMATS.values()
    ]
