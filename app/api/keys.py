"""API keys: admins create and revoke them; the secret is shown once."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from app.api.deps import Admin, DbDep
from app.db.tables import ApiKey, utcnow
from app.errors import not_found
from app.schemas import KeyCreate, KeyOut
from app.security import Role, create_key

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=201, response_model=KeyOut)
def create(body: KeyCreate, _: Admin, db: DbDep) -> dict[str, Any]:
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


@router.delete("/{key_id}", status_code=204)
def revoke(key_id: int, _: Admin, db: DbDep) -> None:
    with db.write() as session:
        key = session.get(ApiKey, key_id)
        if key is None:
            raise not_found("key", key_id)
        key.revoked_at = key.revoked_at or utcnow()
