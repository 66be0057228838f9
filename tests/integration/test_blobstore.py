"""The sealed, streaming blob store on each backend: the database, a folder, and a
real S3 server (SeaweedFS)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database
from app.core.db.tables import Blob, ShortKey
from app.core.settings import Settings
from app.core.storage.blobs import Blobs, object_store
from app.core.storage.crypto import Keyring, SealError, blob_aad, seal
from app.core.storage.keystore import KeyTable, create_keys
from app.core.storage.objects import BlobMissing
from app.core.storage.sealing import HEADER, OVERHEAD, Layout, open_chunks, seal_stream

CHUNK = 4096
SIZES = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 123]


def sealed_chunks(data: bytes, key: str = "model-1/state/x", raw: bytes = b"k" * 32) -> bytes:
    return b"".join(seal_stream(raw, key, [data[:100], data[100:]], CHUNK))


def open_all(sealed: bytes, size: int, key: str = "model-1/state/x", raw: bytes = b"k" * 32):
    layout = Layout(size, CHUNK)
    header, body = sealed[: HEADER.size], sealed[HEADER.size :]
    return b"".join(open_chunks(raw, key, header, layout, 0, layout.chunks - 1, [body]))


@pytest.mark.parametrize("size", SIZES)
def test_sealing_round_trips_and_the_layout_predicts_every_offset(size: int) -> None:
    data = os.urandom(size)
    sealed = sealed_chunks(data)
    layout = Layout(size, CHUNK)
    assert len(sealed) == layout.sealed_size
    assert open_all(sealed, size) == data
    for index in range(layout.chunks):  # each chunk opens alone, from its predicted offset
        at, n = layout.offset(index), OVERHEAD + layout.plain_length(index)
        chunk = sealed[at : at + n]
        header = sealed[: HEADER.size]
        plain = b"".join(
            open_chunks(b"k" * 32, "model-1/state/x", header, layout, index, index, [chunk])
        )
        assert plain == data[index * CHUNK : index * CHUNK + layout.plain_length(index)]


def test_tampered_moved_or_cut_short_chunks_do_not_open() -> None:
    size = 3 * CHUNK + 123
    data = os.urandom(size)
    sealed = bytearray(sealed_chunks(data))
    layout = Layout(size, CHUNK)
    flipped = bytearray(sealed)
    flipped[layout.offset(1) + 40] ^= 1
    c0 = sealed[layout.offset(0) : layout.offset(1)]
    c1 = sealed[layout.offset(1) : layout.offset(2)]
    swapped = sealed[: layout.offset(0)] + c1 + c0 + sealed[layout.offset(2) :]
    dropped_last = sealed[: layout.offset(3)]  # ends on a chunk boundary: still cut short
    cut = sealed[:-5]
    header = bytearray(sealed)
    header[5] ^= 1  # the declared chunk size
    for bad in (flipped, swapped, dropped_last, cut, header):
        with pytest.raises(SealError):
            open_all(bytes(bad), size)
    with pytest.raises(SealError):  # another blob's name, another key
        open_all(bytes(sealed), size, key="model-2/state/x")
    with pytest.raises(SealError):
        open_all(bytes(sealed), size, raw=b"j" * 32)


@pytest.fixture(params=["filesystem", "database", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Blobs]:
    url = f"sqlite:///{tmp_path / 'lethe.db'}"
    upgrade_to_head(url)
    extra = request.getfixturevalue("s3_settings") if request.param == "s3" else {}
    given = {"blob_store": request.param, "blob_chunk_bytes": CHUNK, **extra}
    settings = Settings(data_dir=tmp_path, database_url=url, **given)
    db = database(url)
    yield Blobs(object_store(settings, db), Keyring(os.urandom(32)), db, CHUNK)


def test_write_record_read_ranges_and_retire(store: Blobs) -> None:
    data = os.urandom(3 * CHUNK + 123)
    written = store.write("model-1/weights", [data[:10], memoryview(data)[10:]])
    assert written.size == len(data) and written.location == store.store.location
    with store.db.write() as session:
        store.record(session, written)
    with store.db.read() as session:
        handle = store.open(session, written.key)
    assert handle is not None and bytes(handle.read()) == data
    for start, end in [(0, 1), (5, CHUNK + 7), (CHUNK, 2 * CHUNK), (len(data) - 3, len(data))]:
        assert b"".join(handle.chunks(start, end)) == data[start:end]
    assert written.key in {o.key for o in store.store.listing()}

    with pytest.raises(RuntimeError), store.db.write() as session:  # rolled back: kept
        store.retire(session, [written.key])
        raise RuntimeError("the commit fails")
    assert written.key in {o.key for o in store.store.listing()}
    with store.db.write() as session:
        store.retire(session, [written.key])
    assert written.key not in {o.key for o in store.store.listing()}  # deleted after commit
    with store.db.read() as session:
        assert store.open(session, written.key) is None
        assert session.get(ShortKey, written.key_id) is None  # the key is destroyed


def test_sweep_removes_only_what_no_row_references(store: Blobs) -> None:
    kept = store.write("model-1/weights", [b"referenced"])
    orphan = store.write("model-1/state", [b"written, then the process died"])
    with store.db.write() as session:
        store.record(session, kept)
    assert store.sweep(grace_seconds=3600) == 0  # too young: its commit may be coming
    assert store.sweep(grace_seconds=0) == 1
    listed = {o.key for o in store.store.listing()}
    assert kept.key in listed and orphan.key not in listed
    with store.db.read() as session:
        assert bytes(store.read(session, kept.key) or b"") == b"referenced"


def test_a_missing_or_corrupt_object_is_an_error_never_wrong_bytes(store: Blobs) -> None:
    data = os.urandom(2 * CHUNK)
    gone, bad = (store.write("model-1/weights", [data]) for _ in range(2))
    with store.db.write() as session:
        store.record(session, gone)
        store.record(session, bad)
    store.store.delete([gone.key])
    sealed = bytearray(b"".join(store.store.read(bad.key, 0, 1 << 30)))
    sealed[-1] ^= 1
    store.store.write(bad.key, [bytes(sealed)])
    with store.db.read() as session:
        missing, corrupt = store.open(session, gone.key), store.open(session, bad.key)
    assert missing is not None and corrupt is not None
    with pytest.raises(BlobMissing):
        missing.read()
    with pytest.raises(SealError):
        corrupt.read()
    assert b"".join(corrupt.chunks(0, CHUNK)) == data[:CHUNK]  # an intact range still opens


def test_blobs_of_an_older_database_move_out_under_new_keys(tmp_path: Path) -> None:
    """Before issue 29 a blob was one sealed value in `blobs.data`: `migrate` re-seals it in
    chunks into the configured store, and destroys the old key in the same commit."""
    url = f"sqlite:///{tmp_path / 'lethe.db'}"
    upgrade_to_head(url)
    settings = Settings(data_dir=tmp_path, database_url=url, blob_chunk_bytes=CHUNK)
    db = database(url)
    ring = Keyring(os.urandom(32))
    store = Blobs(object_store(settings, db), ring, db, CHUNK)
    data = os.urandom(5 * CHUNK + 1)
    with db.write() as session:
        [(old_key, raw)] = create_keys(session, ring, 1, KeyTable.short)  # a blob's key
        session.execute(
            text(
                "INSERT INTO blobs (key, data, key_id, size, sha256, location, created_at)"
                " VALUES ('model-1/weights/old', :d, :k, :n, 'x', 'database', '2026-01-01')"
            ),
            {
                "d": seal(raw, data, blob_aad("model-1/weights/old")),
                "k": old_key.hex,
                "n": len(data),
            },
        )
    with db.read() as session:
        assert bytes(store.read(session, "model-1/weights/old") or b"") == data  # readable as is
    assert store.migrate() == 1
    assert store.migrate() == 0
    with db.read() as session:
        row = session.get(Blob, "model-1/weights/old")
        assert row is not None and row.data is None
        assert (row.location, row.chunk_size) == ("filesystem", CHUNK)
        assert row.key_id != old_key and session.get(ShortKey, old_key) is None
        assert bytes(store.read(session, "model-1/weights/old") or b"") == data
    on_disk = (tmp_path / "blobs" / "model-1" / "weights" / "old").read_bytes()
    assert len(on_disk) == Layout(len(data), CHUNK).sealed_size and data[:64] not in on_disk


ROUND_TRIP = """
import json, os, resource, sys, torch
from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database
from app.core.settings import Settings
from app.core.storage.blobs import Blobs, object_store
from app.core.storage.crypto import Keyring
from workers import tensorfile

folder, size = sys.argv[1], int(sys.argv[2])
url = f"sqlite:///{folder}/lethe.db"
upgrade_to_head(url)
db = database(url)
settings = Settings(data_dir=folder, database_url=url)
store = Blobs(object_store(settings, db), Keyring(os.urandom(32)), db)
state = {"gram_inverse": torch.rand(size // 8, dtype=torch.float64)}
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = peak()
_, stream = tensorfile.encode(state)
written = store.write("model-1/state", stream, digest=False)
after_write = peak()
with db.write() as session:
    store.record(session, written)
with db.read() as session:
    back = tensorfile.decode(store.read(session, written.key))
same = bool(torch.equal(back["gram_inverse"], state["gram_inverse"]))
print(json.dumps({"base": base, "after_write": after_write, "after_read": peak(), "same": same}))
"""


@pytest.mark.integration
def test_a_large_state_round_trips_holding_one_copy(tmp_path: Path) -> None:
    """A 512 MiB state written and read back on the filesystem backend: the write holds a
    chunk or two, the read one buffer of the state's size (1 GiB)."""
    size = 512 << 20
    out = subprocess.run(
        [sys.executable, "-c", ROUND_TRIP, str(tmp_path), str(size)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["same"]
    assert seen["after_write"] - seen["base"] < 64 << 20, seen
    assert seen["after_read"] - seen["base"] < 1.5 * size, seen


def test_keys_that_are_not_blob_keys_are_refused(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'x.db'}")
    store = object_store(settings, database(settings.resolved_database_url))
    for bad in ["../escape", "/abs", "a/../../b", "", "x" * 300]:
        with pytest.raises(ValueError):
            store.write(bad, [b"x"])


def test_every_backend_leaves_the_row_count_to_the_database(store: Blobs) -> None:
    """The rows are the truth: writing never adds one, recording adds exactly one."""
    with store.db.read() as session:
        before = session.scalar(select(func.count()).select_from(Blob))
    written = store.write(f"model-{uuid.uuid4().hex[:6]}/weights", [b"x" * 10])
    with store.db.read() as session:
        assert session.scalar(select(func.count()).select_from(Blob)) == before
    with store.db.write() as session:
        store.record(session, written)
    with store.db.read() as session:
        assert session.scalar(select(func.count()).select_from(Blob)) == before + 1


@pytest.mark.integration
@pytest.mark.long
def test_an_object_store_outage_delays_deletions_and_loses_nothing(tmp_path: Path) -> None:
    """SeaweedFS stopped under an embedded service: downloads are 503 with Retry-After, a
    deletion waits (never counted as a failed attempt, so its model is not withdrawn) and
    completes with its certificate once the store is back."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import SMALL_TRAINING, Api, make_keys
    from tests.support.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedServer

    own = SeaweedServer(tmp_path / "seaweed")
    own.start()
    url = f"sqlite:///{tmp_path / 'lethe.db'}"
    upgrade_to_head(url)
    settings = Settings(
        data_dir=tmp_path,
        database_url=url,
        reconcile_seconds=0.3,
        bootstrap_admin_key=False,
        weights_cache_bytes=0,
        job_retries=1,
        retry_backoff_seconds=[1],
        blob_store="s3",
        s3_bucket="outage",
        s3_endpoint_url=own.endpoint,
        s3_access_key_id=S3_ACCESS_KEY,
        s3_secret_access_key=S3_SECRET_KEY,
    )
    try:
        with TestClient(create_app(settings)) as client:
            api = Api(client, url, make_keys(url))
            ds = api.post("/v1/datasets", json={"builtin": "breast_cancer"}).json()
            body = {"name": "m", "dataset_id": ds["id"], "training": SMALL_TRAINING}
            model = api.post("/v1/models", json=body).json()
            assert api.wait(f"/v1/models/{model['id']}", ("ready", "failed"))["status"] == "ready"
            sample = api.get(
                f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": 1}
            ).json()["items"][0]["external_id"]
            own.kill()
            down = api.get(f"/v1/models/{model['id']}/weights")
            assert down.status_code == 503, down.text
            assert down.json()["error"]["code"] == "blob_store_unavailable"
            assert down.headers["retry-after"]
            request = api.post(
                "/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": [sample]}
            ).json()
            time.sleep(8)  # several retry periods: with job_retries=1 a failure would withdraw
            waiting = api.get(f"/v1/deletions/{request['id']}").json()
            assert waiting["status"] in ("queued", "running"), waiting
            assert api.get(f"/v1/models/{model['id']}").json()["status"] == "ready"
            own.start()  # same ports, same data folder
            done = api.wait(f"/v1/deletions/{request['id']}", ("done", "failed"), timeout=60)
            assert done["status"] == "done" and len(done["certificate_ids"]) == 1, done
            assert api.get(f"/v1/models/{model['id']}/weights").status_code == 200
    finally:
        own.kill()


@pytest.mark.integration
def test_seaweedfs_starts_again_on_other_ports_when_one_was_taken(tmp_path: Path) -> None:
    """A port chosen free for the tests' SeaweedFS can be taken before it binds it (another
    test process chose the same one; CI saw it once): it is started again on other ports."""
    import socket

    from tests.support.servers import SeaweedServer

    server = SeaweedServer(tmp_path / "weed")
    taken = server.ports["s3"]
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", taken))
        holder.listen()
        try:
            server.start()
            assert server.ports["s3"] != taken
            assert b"address already in use" in (tmp_path / "weed" / "weed.log").read_bytes()
        finally:
            server.kill()
