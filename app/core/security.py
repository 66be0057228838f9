"""API keys: generated once, stored as sha256, checked by role."""

from __future__ import annotations

import hashlib
import secrets
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.db.tables import ApiKey


class Role(StrEnum):
    admin = "admin"
    requester = "requester"
    auditor = "auditor"
    reader = "reader"


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def create_key(session: Session, role: Role, name: str) -> tuple[ApiKey, str]:
    """Create a key; the raw secret is returned once and never stored."""
    raw = f"lethe_{role.value[:3]}_{secrets.token_urlsafe(32)}"
    key = ApiKey(name=name, role=role.value, key_hash=hash_key(raw), prefix=raw[:14])
    session.add(key)
    session.flush()
    return key, raw


def lookup_key(session: Session, raw: str) -> ApiKey | None:
    key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(raw)))
    if key is None or key.revoked_at is not None:
        return None
    return key


def has_any_key(session: Session) -> bool:
    return session.scalar(select(ApiKey.id).limit(1)) is not None


def sees_forget_set(key: ApiKey) -> bool:
    """Admins and auditors see metrics computed on removed samples; others could learn from
    them who was removed."""
    return key.role in (Role.admin, Role.auditor)
