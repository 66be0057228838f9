"""Datasets read from object storage: `{"source": {"s3": {"bucket": ...,
"key": ...}}}`, read by the registration's child process through Lethe's own S3 settings (no
endpoint or credential comes from the request). A Parquet object is read a row group at a
time through ranged GETs, never whole; a CSV or an .npz whole, once its size is checked."""

from __future__ import annotations

import io
from typing import Any

from app.core.errors import APIError, unprocessable
from app.core.settings import Settings


def s3_client(settings: Settings) -> Any:
    """A boto3 client on the configured endpoint, region and keys (the blob store's)."""
    import boto3
    from botocore.config import Config

    secret = settings.s3_secret_access_key
    return boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region or "us-east-1",
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret is not None else None,
        config=Config(
            retries={"max_attempts": 3, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
            s3={"addressing_style": "path"},
        ),
    )


class RangedObject(io.RawIOBase):
    """A read-only, seekable file over one object: each read is a ranged GET (what pyarrow
    asks for: the footer, then a row group's column chunks)."""

    def __init__(self, client: Any, bucket: str, key: str, size: int) -> None:
        super().__init__()
        self.client, self.bucket, self.key, self.size = client, bucket, key, size
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._at

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self.size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self._at >= self.size or not len(view):
            return 0
        last = min(self.size, self._at + len(view)) - 1
        answer = self.client.get_object(
            Bucket=self.bucket, Key=self.key, Range=f"bytes={self._at}-{last}"
        )
        got = 0
        for piece in answer["Body"].iter_chunks(1 << 20):
            view[got : got + len(piece)] = piece
            got += len(piece)
        self._at += got
        return got


def open_object(settings: Settings, bucket: str, key: str) -> RangedObject:
    """The object, its size read first: 422 naming it when it is missing or unreadable."""
    from botocore.exceptions import BotoCoreError, ClientError

    client = s3_client(settings)
    where = {"bucket": bucket, "key": key}
    try:
        head = client.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}:
            raise unprocessable(
                "source_not_found", f"no object s3://{bucket}/{key}", where
            ) from exc
        raise unprocessable("source_unreadable", f"s3://{bucket}/{key}: {code}", where) from exc
    except BotoCoreError as exc:
        raise APIError(503, "source_unavailable", f"object storage: {exc}", where) from exc
    return RangedObject(client, bucket, key, int(head["ContentLength"]))


def read_whole(source: RangedObject, limit: int) -> bytes:
    """All of a (CSV or .npz) object, refused (413) past `limit` bytes before any is read."""
    if source.size > limit:
        raise APIError(
            413,
            "source_too_large",
            f"the object holds {source.size} bytes; at most {limit} are read whole (Parquet is "
            "read a row group at a time)",
            {"bytes": source.size, "limit": limit},
        )
    out = bytearray(source.size)
    got = 0
    while got < source.size:
        n = source.readinto(memoryview(out)[got:])
        if not n:
            break
        got += n
    return bytes(out[:got])
