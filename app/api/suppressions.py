"""The suppression list over HTTP: how many erased subjects and samples it keeps
out (admins and auditors), and lifting one with a reason (admins: re-consent). Validates and
delegates to app/core/services/suppression.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body
from fastapi.concurrency import run_in_threadpool
from pydantic import ConfigDict, Field, model_validator

from app.api.deps import Admin, Auditor, DbDep, RuntimeDep
from app.api.responses import COMMON, errors
from app.core.jsontypes import JsonObject
from app.core.schemas import In
from app.core.services import suppression

router = APIRouter(prefix="/v1/suppressions", tags=["suppressions"], responses=COMMON)


def _exactly_one_id(schema: dict[str, Any]) -> None:
    """The OpenAPI schema says what the validator does: exactly one of the two ids, a string
    (not null) where given."""
    for name in ("subject_id", "sample_id"):
        field = schema["properties"][name]
        field.update(next(a for a in field.pop("anyOf") if a.get("type") == "string"))
        field.pop("default", None)
    schema["oneOf"] = [{"required": ["subject_id"]}, {"required": ["sample_id"]}]


class LiftIn(In):
    """One subject or sample to take off the list, and why (kept with the row)."""

    model_config = ConfigDict(json_schema_extra=_exactly_one_id)

    subject_id: str | None = Field(None, min_length=1, max_length=200)
    """the person's id, as the team's data names it"""
    sample_id: str | None = Field(None, min_length=1, max_length=200)
    """or one sample's id"""
    reason: str = Field(min_length=3, max_length=2000)
    """why (re-consent, a mistaken request): kept with the suppression"""

    @model_validator(mode="after")
    def _one(self) -> LiftIn:
        if (self.subject_id is None) == (self.sample_id is None):
            raise ValueError("give subject_id or sample_id")
        return self

    @property
    def kind(self) -> Literal["subject", "sample"]:
        return "subject" if self.subject_id is not None else "sample"


@router.get("")
def counts(_: Auditor, db: DbDep) -> JsonObject:
    """How many subjects and samples the list keeps out, and how many were lifted."""
    with db.read() as session:
        return dict(suppression.counts(session))


LIFT_EXAMPLES: JsonObject = {
    "subject": {
        "summary": "a person consented again",
        "value": {"subject_id": "person-0001", "reason": "re-consent, ticket 4411"},
    },
    "sample": {
        "summary": "a sample erased by mistake",
        "value": {"sample_id": "row-0007", "reason": "the request named the wrong row"},
    },
}


@router.post("/lift", responses=errors(404))
async def lift(
    body: Annotated[LiftIn, Body(openapi_examples=LIFT_EXAMPLES)],
    key: Admin,
    db: DbDep,
    runtime: RuntimeDep,
) -> JsonObject:
    """Take one erased subject or sample off the list (its rows may be registered again)."""
    raw = body.subject_id if body.subject_id is not None else body.sample_id
    assert raw is not None

    def unit() -> JsonObject:
        with db.write() as session:
            done = suppression.lift(session, runtime.keyring, body.kind, raw, body.reason, key.id)
        # a restore keeps them lifted (app/core/services/restore.py)
        for token in done["tokens"]:
            runtime.journal.record_lift(token)
        return {**done, "lifted_at": done["lifted_at"].isoformat(), "reason": body.reason}

    return await run_in_threadpool(unit)
