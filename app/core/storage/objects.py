"""Where sealed blob bytes live: the database, a folder, or an S3-compatible bucket.

An object store holds opaque sealed bytes under a key; it knows nothing of data keys or rows.
`write` makes an object visible whole or not at all; `read` streams a byte range; `delete`
is idempotent; `listing` feeds the orphan sweeper (app/core/storage/blobs.py). The `blobs` rows
and data keys in the database stay the truth: an object no row references is an orphan."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import delete, func, insert, select

from app.core.db.chunks import chunked
from app.core.db.session import Database
from app.core.db.tables import BlobChunk

PIECE = 1 << 20  # bytes per piece a read yields unless the caller asks for another size
KEY_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$")


class BlobMissing(LookupError):
    """A committed blob's object is not in its store (deleted by hand, a lost volume)."""


class BlobStoreUnavailable(RuntimeError):
    """The object store did not answer (down, unreachable, refused the credentials)."""


@dataclass(frozen=True)
class StoredObject:
    key: str
    modified: float  # seconds since the epoch
    size: int


class ObjectStore(Protocol):
    location: str  # "database", "filesystem" or "s3": recorded on each blob's row

    def write(self, key: str, pieces: Iterable[bytes]) -> int: ...
    def read(self, key: str, start: int, length: int, piece: int = ...) -> Iterator[bytes]: ...
    def delete(self, keys: Sequence[str]) -> None: ...
    def listing(self) -> Iterator[StoredObject]: ...


def check_key(key: str) -> str:
    if not KEY_PATTERN.match(key) or ".." in key:
        raise ValueError(f"not a blob key: {key!r}")
    return key


class FilesystemObjects:
    """Objects as files under `root` (`<data_dir>/blobs/`, the embedded default). A write goes
    to `root/.incoming/` and is renamed into place after fsync: a crash leaves a temporary
    file (an orphan the sweeper removes), never a partial object."""

    location = "filesystem"
    INCOMING = ".incoming"

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def write(self, key: str, pieces: Iterable[bytes]) -> int:
        target = self._path(key)
        incoming = self.root / self.INCOMING
        incoming.mkdir(parents=True, exist_ok=True)
        temp = incoming / uuid.uuid4().hex
        written = 0
        try:
            with temp.open("wb") as fh:
                for piece in pieces:
                    fh.write(piece)
                    written += len(piece)
                fh.flush()
                os.fsync(fh.fileno())
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_dir(target.parent)
        return written

    def read(self, key: str, start: int, length: int, piece: int = PIECE) -> Iterator[bytes]:
        try:
            fh = self._path(key).open("rb")
        except FileNotFoundError as exc:
            raise BlobMissing(f"blob {key!r} is not in {self.root}") from exc
        return _read_file(fh, start, length, piece)

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def listing(self) -> Iterator[StoredObject]:
        for folder, _, files in os.walk(self.root):
            for name in files:
                path = Path(folder) / name
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                yield StoredObject(str(path.relative_to(self.root)), stat.st_mtime, stat.st_size)


def _read_file(fh: Any, start: int, length: int, piece: int) -> Iterator[bytes]:
    with fh:
        fh.seek(start)
        left = length
        while left > 0:
            data = fh.read(min(piece, left))
            if not data:
                return
            left -= len(data)
            yield data


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DatabaseObjects:
    """Objects as rows of `blob_chunks` (4 MiB each), for small deployments: one database to
    back up. Written in transactions of their own before the commit that references them, in
    batches, so the write lock is never held for a whole large blob."""

    location = "database"
    ROW_BYTES = 4 << 20
    ROWS_PER_COMMIT = 8

    def __init__(self, db: Database) -> None:
        self.db = db

    def write(self, key: str, pieces: Iterable[bytes]) -> int:
        check_key(key)
        written, index, batch = 0, 0, []
        for piece in _repiece(pieces, self.ROW_BYTES):
            batch.append({"key": key, "idx": index, "data": piece})
            index += 1
            written += len(piece)
            if len(batch) == self.ROWS_PER_COMMIT:
                self._insert(key, batch, replace=index == len(batch))
                batch = []
        if batch or index == 0:
            self._insert(key, batch or [{"key": key, "idx": 0, "data": b""}], index == len(batch))
        return written

    def _insert(self, key: str, rows: list[dict[str, Any]], replace: bool) -> None:
        with self.db.write() as session:
            if replace:  # the first batch replaces an object of the same key
                session.execute(delete(BlobChunk).where(BlobChunk.key == key))
            session.execute(insert(BlobChunk), rows)

    def read(self, key: str, start: int, length: int, piece: int = PIECE) -> Iterator[bytes]:
        first, last = start // self.ROW_BYTES, (start + length - 1) // self.ROW_BYTES
        with self.db.read() as session:
            present = session.scalar(select(func.count()).where(BlobChunk.key == key))
        if not present:
            raise BlobMissing(f"blob {key!r} has no rows in blob_chunks")
        return _repiece(self._pieces(key, start, length, first, last), piece)

    def _pieces(self, key: str, start: int, length: int, first: int, last: int) -> Iterator[bytes]:
        skip, left = start - first * self.ROW_BYTES, length
        for index in range(first, last + 1):  # one row per query: memory stays one piece
            with self.db.read() as session:
                data = session.scalar(
                    select(BlobChunk.data).where(BlobChunk.key == key, BlobChunk.idx == index)
                )
            if data is None:
                return
            piece = data[skip : skip + left]
            skip = 0
            left -= len(piece)
            yield piece
            if left <= 0:
                return

    def delete(self, keys: Sequence[str]) -> None:
        for part in chunked(list(keys)):
            with self.db.write() as session:
                session.execute(delete(BlobChunk).where(BlobChunk.key.in_(part)))

    def listing(self) -> Iterator[StoredObject]:
        with self.db.read() as session:
            rows = session.execute(
                select(
                    BlobChunk.key,
                    func.min(BlobChunk.created_at),
                    func.sum(func.length(BlobChunk.data)),
                ).group_by(BlobChunk.key)
            ).all()
        for key, created, size in rows:
            yield StoredObject(key, created.timestamp() if created else 0.0, int(size or 0))


def _repiece(pieces: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The concatenated pieces, re-cut into `size` bytes (the last may be shorter)."""
    buf = bytearray()
    for piece in pieces:
        buf += piece
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


class _PiecesReader:
    """A read-only file over an iterator of bytes, for boto3's managed (multipart) upload."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._it = iter(pieces)
        self._buf = bytearray()
        self.total = 0

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self._buf) < n:
            piece = next(self._it, None)
            if piece is None:
                break
            self._buf += piece
        take = len(self._buf) if n < 0 else min(n, len(self._buf))
        out = bytes(self._buf[:take])
        del self._buf[:take]
        self.total += len(out)
        return out


class S3Objects:
    """Objects in an S3-compatible bucket (distributed mode), with boto3: multipart uploads
    from a stream (an object appears whole when the upload completes), ranged GETs."""

    location = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        part_bytes: int = 16 << 20,
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        self.bucket, self.prefix = bucket, prefix
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region or "us-east-1",
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=Config(
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                s3={"addressing_style": "path"},
            ),
        )
        self.transfer = TransferConfig(
            multipart_threshold=part_bytes, multipart_chunksize=part_bytes, max_concurrency=2
        )
        # s3transfer buffers 10 parts of a stream by default (160 MiB here): two in flight
        # and two waiting bound an upload's memory to about four parts.
        self.transfer.max_in_memory_upload_chunks = 2
        self._ready = False

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def ensure_bucket(self) -> None:
        """Create the bucket when it does not exist (once per process)."""
        if self._ready:
            return
        from botocore.exceptions import ClientError

        with _unavailable():
            try:
                self.client.head_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if _code(exc) not in {"404", "NoSuchBucket", "NotFound"}:
                    raise
                try:
                    self.client.create_bucket(Bucket=self.bucket)
                except ClientError as again:  # another process created it meanwhile
                    if _code(again) in {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}:
                        pass
                    elif not self._appears():
                        raise
        self._ready = True

    def _appears(self, attempts: int = 50, pause: float = 0.1) -> bool:
        """Whether the bucket exists after all, within a few seconds of a creation that
        failed: in one full run SeaweedFS answered CreateBucket with NoSuchBucket as two
        workers and an API started together (a race with another creation is the likely
        cause; 8 concurrent creations, 5 times, did not reproduce it)."""
        from botocore.exceptions import ClientError

        for _ in range(attempts):
            try:
                self.client.head_bucket(Bucket=self.bucket)
                return True
            except ClientError:
                time.sleep(pause)
        return False

    def write(self, key: str, pieces: Iterable[bytes]) -> int:
        self.ensure_bucket()
        reader = _PiecesReader(pieces)
        with _unavailable():
            self.client.upload_fileobj(reader, self.bucket, self._key(key), Config=self.transfer)
        return reader.total

    def read(self, key: str, start: int, length: int, piece: int = PIECE) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        with _unavailable():
            try:
                answer = self.client.get_object(
                    Bucket=self.bucket,
                    Key=self._key(key),
                    Range=f"bytes={start}-{start + max(length, 1) - 1}",
                )
            except ClientError as exc:
                if _code(exc) in {"NoSuchKey", "404", "NotFound"}:
                    raise BlobMissing(f"blob {key!r} is not in bucket {self.bucket!r}") from exc
                if _code(exc) == "InvalidRange":  # an empty object
                    return iter(())
                raise
        body = answer["Body"]
        return _closing(body.iter_chunks(piece), body)

    def delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with _unavailable():
            for part in chunked(list(keys), 1000):
                self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self._key(k)} for k in part], "Quiet": True},
                )

    def listing(self) -> Iterator[StoredObject]:
        self.ensure_bucket()
        with _unavailable():
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    yield StoredObject(
                        item["Key"][len(self.prefix) :],
                        item["LastModified"].timestamp(),
                        int(item["Size"]),
                    )


def _closing(chunks: Iterator[bytes], body: Any) -> Iterator[bytes]:
    try:
        with _unavailable():  # a connection lost mid-body is an outage too
            yield from chunks
    finally:
        body.close()


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextmanager
def _unavailable() -> Iterator[None]:
    """Turn a connection or credentials failure of the object store into BlobStoreUnavailable."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except BotoCoreError as exc:
        raise BlobStoreUnavailable(f"the object store is unreachable: {exc}") from exc
    except ClientError as exc:
        if _code(exc) in _UNAVAILABLE:
            raise BlobStoreUnavailable(f"the object store refused: {_code(exc)}") from exc
        raise


_UNAVAILABLE = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AccessDenied",
    "ServiceUnavailable",
    "SlowDown",
    "InternalError",
}
