"""The one place blobs (weights, noise-free states) are read and written.

Every blob is sealed with its own data key (app/storage/crypto.py): deleting a blob destroys its
key, so the copies the database's free space, WAL or backups keep can never be opened. Behind
this small interface a filesystem or S3-compatible store can replace the database."""

from __future__ import annotations

import hashlib
import uuid
from typing import Protocol

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.db.tables import Blob
from app.storage.crypto import Keyring, blob_aad, keyring, open_sealed, seal
from app.storage.keystore import create_keys, destroy_keys, load_keys


class BlobStore(Protocol):
    def put(self, data: bytes, prefix: str) -> tuple[str, str]: ...
    def get(self, key: str) -> bytes | None: ...
    def delete(self, keys: list[str]) -> None: ...


class DatabaseBlobStore:
    """Blobs as rows of `blobs`, inside the caller's transaction (so writes are atomic)."""

    def __init__(self, session: Session, ring: Keyring | None = None) -> None:
        self.session = session
        self.ring = ring or keyring()

    def put(self, data: bytes, prefix: str) -> tuple[str, str]:
        """Store bytes sealed with a new data key; return (key, sha256 hex of the plaintext)."""
        digest = hashlib.sha256(data).hexdigest()
        key = f"{prefix}/{uuid.uuid4().hex}"
        [(key_id, raw)] = create_keys(self.session, self.ring, 1)
        sealed = seal(raw, data, blob_aad(key))
        self.session.add(Blob(key=key, data=sealed, key_id=key_id, size=len(data), sha256=digest))
        return key, digest

    def get(self, key: str) -> bytes | None:
        row = self.session.execute(select(Blob.data, Blob.key_id).where(Blob.key == key)).first()
        if row is None or row.key_id is None:
            return None
        raw = load_keys(self.session, self.ring, [row.key_id]).get(row.key_id)
        return None if raw is None else open_sealed(raw, row.data, blob_aad(key))

    def delete(self, keys: list[str]) -> None:
        """Delete the rows and destroy their keys: erased weights are gone, not hidden."""
        if keys:
            key_ids = self.session.scalars(select(Blob.key_id).where(Blob.key.in_(keys))).all()
            self.session.execute(delete(Blob).where(Blob.key.in_(keys)))
            destroy_keys(self.session, [k for k in key_ids if k is not None])
