"""API keys: admins create and revoke them; the secret is shown once.

An admin cannot revoke the key it is using, nor the last active admin key: either would
lock every administrator out (the only way back would be the database itself)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from sqlalchemy import select

from app.api.deps import Admin, AnyRole, DbDep
from app.api.params import PathId
from app.api.responses import COMMON, errors
from app.core.db.tables import ApiKey, utcnow
from app.core.errors import conflict, not_found
from app.core.schemas import KeyCreate, KeyOut
from app.core.security import Role, create_key

router = APIRouter(prefix="/v1/keys", tags=["keys"], responses=COMMON)


@router.get("/me", response_model=KeyOut)
def me(key: AnyRole) -> dict[str, Any]:
    """The calling key (never its secret): the dashboard signs in with it."""
    return {
        "id": key.id,
        "name": key.name,
        "role": key.role,
        "prefix": key.prefix,
        "created_at": key.created_at,
    }


@router.post("", status_code=201, response_model=KeyOut)
def create(
    body: Annotated[
        KeyCreate,
        Body(
            openapi_examples={
                "auditor": {"summary": "an auditor's key", "value": {"role": "auditor"}},
                "requester": {
                    "summary": "a named requester key",
                    "value": {"role": "requester", "name": "privacy desk"},
                },
            }
        ),
    ],
    _: Admin,
    db: DbDep,
) -> dict[str, Any]:
    with db.write() as session:
        key, raw = create_key(session, Role(body.role), body.name)
        return {
            "id": key.id,
            "name": key.name,
            "role": key.role,
            "key": raw,
            "prefix": key.prefix,
            "created_at": key.created_at,
        }


@router.delete("/{key_id:int}", status_code=204, responses=errors(404, 409))
def revoke(key_id: PathId, caller: Admin, db: DbDep, request: Request) -> None:
    """Revoke a key (idempotent). 409 for the caller's own key and for the last active
    admin key."""
    with db.write() as session:
        key = session.get(ApiKey, key_id)
        if key is None:
            raise not_found("key", key_id)
        if key.revoked_at is not None:
            return
        if key.role == Role.admin:
            # Lock the active admin keys (PostgreSQL; SQLite's write transaction is already
            # exclusive) so that two admins revoking each other cannot both succeed.
            admins = session.scalars(
                select(ApiKey.id)
                .where(ApiKey.role == Role.admin.value, ApiKey.revoked_at.is_(None))
                .with_for_update()
            ).all()
            if set(admins) <= {key.id}:
                raise conflict(
                    "last_admin_key",
                    "this is the last active admin key; create another admin key first",
                )
        if key.id == caller.id:
            raise conflict(
                "own_key", "a key cannot revoke itself; revoke it with another admin key"
            )
        key.revoked_at = utcnow()
        revoked_hash = key.key_hash
    request.app.state.key_cache.forget(revoked_hash)
