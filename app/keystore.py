"""The `data_keys` table: create, load (unwrapped) and destroy data keys in bulk."""

from __future__ import annotations

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from app.crypto import Keyring
from app.db.chunks import chunked
from app.db.session import rowcount
from app.db.tables import DataKey


def create_keys(session: Session, ring: Keyring, count: int) -> list[tuple[int, bytes]]:
    """`count` fresh data keys, stored wrapped: [(key_id, raw key)] in creation order."""
    if count == 0:
        return []
    fresh = [ring.new_data_key() for _ in range(count)]
    rows = [{"wrapped": wrapped, "kek_id": ring.kek_id} for _, wrapped in fresh]
    ids = session.scalars(
        insert(DataKey).returning(DataKey.id, sort_by_parameter_order=True), rows
    ).all()
    return [(key_id, raw) for key_id, (raw, _) in zip(ids, fresh, strict=True)]


def load_keys(session: Session, ring: Keyring, key_ids: list[int]) -> dict[int, bytes]:
    """The raw data keys for these ids; a destroyed key is simply absent."""
    out: dict[int, bytes] = {}
    for chunk in chunked(sorted(set(key_ids))):
        for key_id, wrapped in session.execute(
            select(DataKey.id, DataKey.wrapped).where(DataKey.id.in_(chunk))
        ):
            out[key_id] = ring.unwrap(wrapped)
    return out


def destroy_keys(session: Session, key_ids: list[int]) -> int:
    """Delete these keys: what they sealed can no longer be opened. Returns how many."""
    destroyed = 0
    for chunk in chunked(sorted(set(key_ids))):
        destroyed += rowcount(session.execute(delete(DataKey).where(DataKey.id.in_(chunk))))
    return destroyed
