"""Typed ids in paths and queries: 1 to `MAX_ID` (2^53 - 1), so that an id the database could
not even compare is a 422 from validation (and documented as such), never a database error."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from app.core.schemas import MAX_ID

PathId = Annotated[int, Path(ge=1, le=MAX_ID)]
QueryId = Annotated[int | None, Query(ge=1, le=MAX_ID)]
