"""The one place blobs (weights, noise-free states) are read and written.

Behind this small interface a filesystem or S3-compatible store can replace the database.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Protocol

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.db.tables import Blob


class BlobStore(Protocol):
    def put(self, data: bytes, prefix: str) -> tuple[str, str]: ...
    def get(self, key: str) -> bytes | None: ...
    def delete(self, keys: list[str]) -> None: ...


class DatabaseBlobStore:
    """Blobs as rows of `blobs`, inside the caller's transaction (so writes are atomic)."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def put(self, data: bytes, prefix: str) -> tuple[str, str]:
        """Store bytes; return (key, sha256 hex)."""
        digest = hashlib.sha256(data).hexdigest()
        key = f"{prefix}/{uuid.uuid4().hex}"
        self.session.add(Blob(key=key, data=data, size=len(data), sha256=digest))
        return key, digest

    def get(self, key: str) -> bytes | None:
        return self.session.scalar(select(Blob.data).where(Blob.key == key))

    def delete(self, keys: list[str]) -> None:
        """Remove the bytes themselves: erased weights are gone, not hidden."""
        if keys:
            self.session.execute(delete(Blob).where(Blob.key.in_(keys)))
