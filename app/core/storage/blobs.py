"""The one place blobs (weights, noise-free states) are read and written.

A blob's bytes are sealed in chunks under its own data key (app/core/storage/sealing.py) and kept
in an object store (app/core/storage/objects.py: the database, a folder or an S3 bucket); its row
in `blobs` and its wrapped data key stay in the database, which is the truth:

- **write, then record.** `write` seals and stores the bytes as a stream, with no transaction
  open; `record` adds the key and the row inside the commit that references the blob. A crash
  in between leaves an object nobody references: `sweep` removes it after a grace period.
- **retire = erase.** `retire` deletes the rows and destroys the data keys in the caller's
  transaction; the objects are deleted once that commit is durable (a failed delete leaves
  ciphertext whose key is gone, and the sweeper retries). No committed row ever points at an
  object deleted before its commit.
- **read as a stream.** `open` returns a handle that yields plaintext chunk by chunk, for any
  byte range; `read` fills one buffer of the blob's size. A missing object raises BlobMissing,
  a tampered one SealError: never wrong bytes."""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, bindparam, delete, event, insert, select
from sqlalchemy.orm import Session

from app.core.db.chunks import chunked
from app.core.db.session import Database, database
from app.core.db.tables import Base, Blob, ShortKey, utcnow
from app.core.settings import Settings
from app.core.storage.crypto import Keyring, SealError, blob_aad, keyring, open_sealed
from app.core.storage.keystore import KeyTable, destroy_keys, load_keys
from app.core.storage.objects import (
    BlobMissing,
    BlobStoreUnavailable,
    DatabaseObjects,
    FilesystemObjects,
    ObjectStore,
    S3Objects,
)
from app.core.storage.sealing import (
    HEADER,
    OVERHEAD,
    Layout,
    open_chunks,
    open_into,
    parse_header,
    seal_stream,
)

log = logging.getLogger("lethe.blobs")

__all__ = ["BlobMissing", "BlobStoreUnavailable", "Blobs", "OpenBlob", "WrittenBlob", "blobs"]

_RETIRED = "lethe.retired_objects"  # Session.info: objects to delete once the commit is durable


@dataclass(frozen=True)
class WrittenBlob:
    """A blob whose sealed bytes are stored but not yet referenced by any committed row."""

    key: str
    key_id: uuid.UUID
    wrapped: bytes
    size: int
    sha256: str
    location: str
    chunk_size: int


@dataclass(frozen=True)
class OpenBlob:
    """A blob ready to read: its data key is unwrapped, its bytes are where `store` says."""

    key: str
    size: int
    sha256: str
    data_key: bytes
    store: ObjectStore | None  # None: a format-1 blob, whole in `legacy`
    chunk_size: int | None
    legacy: bytes | None = None

    def chunks(self, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Plaintext bytes [start, end) in pieces of at most one chunk."""
        end = self.size if end is None else min(end, self.size)
        if start >= end:
            return iter(())
        if self.store is None or self.chunk_size is None:
            assert self.legacy is not None
            plain = open_sealed(self.data_key, self.legacy, blob_aad(self.key))
            return iter((plain[start:end],))
        return self._sealed_range(start, end)

    def _header(self) -> bytes:
        assert self.store is not None
        header = b"".join(self.store.read(self.key, 0, HEADER.size))
        if parse_header(header, self.key) != self.chunk_size:
            raise SealError(f"blob {self.key!r}: its header disagrees with its row")
        return header

    def _sealed(self, layout: Layout, first: int, last: int) -> Iterator[bytes]:
        """The sealed bytes of chunks first … last, read in pieces of one sealed chunk."""
        assert self.store is not None
        offset = layout.offset(first)
        length = layout.offset(last) + OVERHEAD + layout.plain_length(last) - offset
        return self.store.read(self.key, offset, length, layout.chunk_size + OVERHEAD)

    def _sealed_range(self, start: int, end: int) -> Iterator[bytes]:
        assert self.chunk_size is not None
        layout = Layout(self.size, self.chunk_size)
        first, last = start // self.chunk_size, (end - 1) // self.chunk_size
        header = self._header()
        sealed = self._sealed(layout, first, last)
        at = first * self.chunk_size
        for plain in open_chunks(self.data_key, self.key, header, layout, first, last, sealed):
            lo, hi = max(start - at, 0), min(end - at, len(plain))
            at += len(plain)
            if lo == 0 and hi == len(plain):
                yield plain
            elif lo < hi:
                yield plain[lo:hi]
            if at >= end:
                return

    def read(self) -> bytearray:
        """The whole blob in one buffer of its size (the only whole copy held), each chunk
        decrypted straight into its place."""
        out = bytearray(self.size)
        if self.store is None or self.chunk_size is None:
            out[:] = b"".join(self.chunks())
            return out
        if self.size:
            layout = Layout(self.size, self.chunk_size)
            sealed = self._sealed(layout, 0, layout.chunks - 1)
            with memoryview(out) as view:
                open_into(self.data_key, self.key, self._header(), layout, sealed, view)
        return out


_BLOB_ROWS, _KEY_ROWS = Base.metadata.tables["blobs"], Base.metadata.tables[KeyTable.short]
# built once: a commit records and retires blobs on every update
_INSERT_KEY = insert(_KEY_ROWS)
_INSERT_BLOB = insert(_BLOB_ROWS)
_RETIRE = (
    delete(_BLOB_ROWS)
    .where(_BLOB_ROWS.c.key.in_(bindparam("keys", expanding=True)))
    .returning(_BLOB_ROWS.c.key, _BLOB_ROWS.c.key_id, _BLOB_ROWS.c.location)
)


class Blobs:
    """Sealed, streamed blobs in one object store, their keys and rows in the database."""

    def __init__(
        self, store: ObjectStore, ring: Keyring, db: Database, chunk_size: int = 1 << 20
    ) -> None:
        self.store, self.ring, self.db, self.chunk_size = store, ring, db, chunk_size
        self._database_store = store if isinstance(store, DatabaseObjects) else DatabaseObjects(db)

    def write(
        self, prefix: str, pieces: Iterable[bytes | memoryview], digest: bool = True
    ) -> WrittenBlob:
        """Seal `pieces` under a new data key into a new object; nothing is committed. The
        plaintext is hashed as it streams when `digest` (the weights' ETag and audit hash)."""
        key = f"{prefix}/{uuid.uuid4().hex}"
        raw, wrapped = self.ring.new_data_key()
        hasher = hashlib.sha256() if digest else None
        size = [0]

        def counted() -> Iterator[bytes | memoryview]:
            for piece in pieces:
                view = memoryview(piece).cast("B")
                size[0] += len(view)
                if hasher is not None:
                    hasher.update(view)
                yield view

        sealed = seal_stream(raw, key, counted(), self.chunk_size)
        self.store.write(key, sealed)
        return WrittenBlob(
            key=key,
            key_id=uuid.uuid4(),
            wrapped=wrapped,
            size=size[0],
            sha256=hasher.hexdigest() if hasher is not None else "",
            location=self.store.location,
            chunk_size=self.chunk_size,
        )

    def record(self, session: Session, *written: WrittenBlob) -> None:
        """Reference written blobs: their wrapped keys and their rows, in the caller's commit
        (one executemany per table, run now, not at the session's next flush)."""
        if not written:
            return
        conn = session.connection()
        for statement, (_, rows) in zip(
            (_INSERT_KEY, _INSERT_BLOB), self.rows(*written), strict=True
        ):
            conn.execute(statement, rows)

    def rows(self, *written: WrittenBlob) -> list[tuple[Table, list[dict[str, Any]]]]:
        """What `record` inserts, table by table (keys before the blobs that refer to them),
        for a caller that inserts them with rows of its own (`bulk.insert_together`)."""
        now = utcnow()
        keys = [{"id": b.key_id, "wrapped": b.wrapped, "kek_id": self.ring.kek_id} for b in written]
        rows = [
            {
                "key": b.key,
                "key_id": b.key_id,
                "size": b.size,
                "sha256": b.sha256,
                "location": b.location,
                "chunk_size": b.chunk_size,
                "created_at": now,
            }
            for b in written
        ]
        return [(_KEY_ROWS, keys), (_BLOB_ROWS, rows)]

    def discard(self, written: Iterable[WrittenBlob]) -> None:
        """Delete objects that will never be recorded (their commit failed); best effort, the
        sweeper removes what this misses."""
        try:
            self.store.delete([w.key for w in written])
        except Exception:
            log.warning("could not delete unreferenced blobs; the sweeper will", exc_info=True)

    def open(self, session: Session, key: str) -> OpenBlob | None:
        """The blob to read, or None when it has no row or its key was destroyed (erased)."""
        row = session.execute(
            select(
                Blob.key_id, Blob.size, Blob.sha256, Blob.location, Blob.chunk_size, Blob.data
            ).where(Blob.key == key)
        ).first()
        if row is None or row.key_id is None:
            return None
        raw = load_keys(session, self.ring, [row.key_id], KeyTable.short).get(row.key_id)
        if raw is None:
            return None
        if row.chunk_size is None:
            return OpenBlob(key, row.size, row.sha256, raw, None, None, row.data)
        store = self._store_at(row.location)
        return OpenBlob(key, row.size, row.sha256, raw, store, row.chunk_size)

    def read(self, session: Session, key: str) -> bytearray | None:
        """The whole blob, or None when it was erased."""
        handle = self.open(session, key)
        return None if handle is None else handle.read()

    def retire(self, session: Session, keys: list[str], destroy: bool = True) -> list[uuid.UUID]:
        """Erase these blobs in the caller's transaction: rows deleted, data keys destroyed;
        their objects are deleted once the commit is durable. Returns the data keys' ids;
        with `destroy=False` the caller destroys them (`KeyTable.short`) in the same
        transaction, with others in one DELETE."""
        keys = [k for k in keys if k]
        if not keys:
            return []
        return self.retired(session, session.connection().execute(_RETIRE, {"keys": keys}), destroy)

    def retired(
        self, session: Session, rows: Iterable[Any], destroy: bool = True
    ) -> list[uuid.UUID]:
        """What `retire` does once the blobs' rows are deleted, given the deleted rows' `key`,
        `key_id` and `location` (a caller that deleted them in a statement of its own)."""
        rows = list(rows)
        key_ids = [r.key_id for r in rows if r.key_id is not None]
        if destroy:
            destroy_keys(session, key_ids, KeyTable.short)
        retired: list[tuple[ObjectStore, str]] = session.info.setdefault(_RETIRED, [])
        for row in rows:
            try:
                retired.append((self._store_at(row.location), row.key))
            except BlobStoreUnavailable:
                log.warning("blob %s is in %s, not configured here", row.key, row.location)
        return key_ids

    def _store_at(self, location: str) -> ObjectStore:
        if location == self.store.location:
            return self.store
        if location == "database":
            return self._database_store
        raise BlobStoreUnavailable(
            f"this blob is stored in {location!r}, but this deployment is configured for "
            f"{self.store.location!r}; run `lethe storage migrate` where both are reachable"
        )

    def sweep(self, grace_seconds: float) -> int:
        """Delete objects no blob row references and older than `grace_seconds` (a crash
        between a write and its commit, a delete that failed). Returns how many."""
        cutoff = time.time() - grace_seconds
        stale = [o.key for o in self.store.listing() if o.modified < cutoff]
        orphans: list[str] = []
        for part in chunked(stale):
            with self.db.read() as session:
                known = set(session.scalars(select(Blob.key).where(Blob.key.in_(part))))
            orphans += [k for k in part if k not in known]
        if orphans:
            self.store.delete(orphans)
            log.info("swept %d orphaned blob objects", len(orphans))
        return len(orphans)

    def migrate(self, limit: int | None = None) -> int:
        """Move blobs stored elsewhere (format-1 rows, another location) into this store under
        new data keys, one commit per blob; the old keys are destroyed in that commit. Returns
        how many moved."""
        moved = 0
        while limit is None or moved < limit:
            with self.db.read() as session:
                key = session.scalar(
                    select(Blob.key)
                    .where(
                        Blob.key_id.is_not(None),
                        (Blob.chunk_size.is_(None)) | (Blob.location != self.store.location),
                    )
                    .order_by(Blob.key)
                    .limit(1)
                )
                handle = self.open(session, key) if key is not None else None
            if key is None:
                return moved
            if handle is None:
                continue
            self._move(key, handle)
            moved += 1
        return moved

    def _move(self, key: str, handle: OpenBlob) -> None:
        raw, wrapped = self.ring.new_data_key()
        old = handle.store
        self.store.write(key, seal_stream(raw, key, handle.chunks(), self.chunk_size))
        new_id = uuid.uuid4()

        def commit(session: Session) -> None:
            row = session.get(Blob, key)
            if row is None:  # retired meanwhile
                return
            old_id = row.key_id
            session.add(ShortKey(id=new_id, wrapped=wrapped, kek_id=self.ring.kek_id))
            row.key_id, row.data = new_id, None
            row.location, row.chunk_size = self.store.location, self.chunk_size
            if old_id is not None:
                destroy_keys(session, [old_id], KeyTable.short)
            if old is not None and old is not self.store:
                session.info.setdefault(_RETIRED, []).append((old, key))

        self.db.run(commit)


@event.listens_for(Session, "after_commit")
def _delete_retired_objects(session: Session) -> None:
    retired: list[tuple[ObjectStore, str]] = session.info.pop(_RETIRED, [])
    by_store: dict[int, tuple[ObjectStore, list[str]]] = {}
    for store, key in retired:
        by_store.setdefault(id(store), (store, []))[1].append(key)
    for store, keys in by_store.values():
        try:
            store.delete(keys)
        except Exception:  # the keys are destroyed; the sweeper deletes the ciphertext later
            log.warning("deleting %d retired blob objects failed", len(keys), exc_info=True)


@event.listens_for(Session, "after_rollback")
def _keep_retired_objects(session: Session) -> None:
    session.info.pop(_RETIRED, None)


def object_store(settings: Settings, db: Database) -> ObjectStore:
    """The object store the settings name."""
    if settings.blob_store == "database":
        return DatabaseObjects(db)
    if settings.blob_store == "s3":
        assert settings.s3_bucket is not None  # Settings checks it
        secret = settings.s3_secret_access_key
        return S3Objects(
            settings.s3_bucket,
            settings.s3_prefix,
            settings.s3_endpoint_url,
            settings.s3_region,
            settings.s3_access_key_id,
            secret.get_secret_value() if secret is not None else None,
        )
    return FilesystemObjects(settings.resolved_blob_dir)


def blobs(settings: Settings, ring: Keyring | None = None) -> Blobs:
    """The blob store `settings` configure: a Runtime makes one (app/core/runtime.py), the
    `lethe storage` commands one each."""
    db = database(settings.resolved_database_url)
    ring = ring or keyring(settings)
    return Blobs(object_store(settings, db), ring, db, settings.blob_chunk_bytes)
