"""Weights downloads stream from the blob store: ETag/304, one byte range (206,
416), and a missing or corrupt object is a JSON error with a code, never wrong bytes."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import select

from app.core.db.session import database
from app.core.db.tables import ModelVersion
from app.core.settings import Settings
from tests.conftest import SMALL_TRAINING, Api


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """conftest's settings with small chunks and no cache: every download streams."""
    return settings.model_copy(update={"blob_chunk_bytes": 4096, "weights_cache_bytes": 0})


@pytest.fixture
def mlp(api: Api, digits: dict) -> dict:
    body = {
        "name": "mlp",
        "dataset_id": digits["id"],
        "architecture": {"type": "mlp", "hidden": [64]},
        "training": SMALL_TRAINING,
    }
    created = api.post("/v1/models", json=body)
    assert created.status_code == 202, created.text
    return api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))


def test_weights_stream_with_etag_and_ranges(api: Api, mlp: dict) -> None:
    path = f"/v1/models/{mlp['id']}/weights"
    full = api.get(path)
    assert full.status_code == 200 and full.headers["accept-ranges"] == "bytes"
    body = full.content
    assert len(body) > 3 * 4096  # several sealed chunks
    etag = full.headers["etag"]
    assert etag == f'"{hashlib.sha256(body).hexdigest()}"'
    assert int(full.headers["content-length"]) == len(body)

    assert api.get(path, headers={"If-None-Match": etag}).status_code == 304
    for asked, start, end in [
        ("bytes=0-0", 0, 1),
        ("bytes=10-4200", 10, 4201),  # across a chunk boundary
        ("bytes=4096-8191", 4096, 8192),  # exactly one chunk
        (f"bytes={len(body) - 7}-", len(body) - 7, len(body)),
        ("bytes=-100", len(body) - 100, len(body)),
        (f"bytes=5-{len(body) + 50}", 5, len(body)),  # clipped to the end
    ]:
        part = api.get(path, headers={"Range": asked})
        assert part.status_code == 206, (asked, part.text)
        assert part.content == body[start:end], asked
        assert part.headers["content-range"] == f"bytes {start}-{end - 1}/{len(body)}"
        assert part.headers["etag"] == etag
    for ignored in ["bytes=0-1,5-6", "items=0-5", "bytes=9-3"]:
        whole = api.get(path, headers={"Range": ignored})
        assert whole.status_code == 200 and whole.content == body, ignored
    stale = api.get(path, headers={"Range": "bytes=0-9", "If-Range": '"another"'})
    assert stale.status_code == 200 and stale.content == body
    fresh = api.get(path, headers={"Range": "bytes=0-9", "If-Range": etag})
    assert fresh.status_code == 206 and fresh.content == body[:10]
    past = api.get(path, headers={"Range": f"bytes={len(body)}-"})
    assert past.status_code == 416
    assert past.json()["error"]["code"] == "range_not_satisfiable"
    assert past.headers["content-range"] == f"bytes */{len(body)}"


def test_a_missing_or_corrupt_object_is_an_error_with_a_code(api: Api, mlp: dict) -> None:
    path = f"/v1/models/{mlp['id']}/weights"
    assert api.get(path).status_code == 200
    with database(api.url).read() as session:
        key = session.scalar(select(ModelVersion.weights_key))
    store = api.runtime.blobs.store
    sealed = b"".join(store.read(key, 0, 1 << 30))
    tampered = bytearray(sealed)
    tampered[100] ^= 1
    store.write(key, [bytes(tampered)])
    corrupt = api.get(path)
    assert corrupt.status_code == 500 and corrupt.json()["error"]["code"] == "blob_corrupt"
    assert api.get(path, headers={"Range": "bytes=0-9"}).status_code == 500
    store.delete([key])
    missing = api.get(path)
    assert missing.status_code == 503 and missing.json()["error"]["code"] == "blob_missing"
    assert missing.headers["retry-after"]
    store.write(key, [sealed])  # put back: served again, the same bytes
    again = api.get(path)
    assert again.status_code == 200
    assert again.headers["etag"] == f'"{hashlib.sha256(again.content).hexdigest()}"'
