"""Erased means gone: a byte search of the database files after a deletion.

The search reads what an attacker with file access reads: SQLite's main file, WAL and shm;
PostgreSQL's heap, index and TOAST pages of Lethe's tables (pageinspect). Payloads, statistics
and weights are sealed with per-sample and per-blob data keys, so their plaintext is never
there; erasure destroys the keys, and compaction removes the wrapped keys' own bytes. The
control (a retained sample's wrapped key is still found) shows the search reads the data.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.accesslog import DropQueryString
from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database, dispose_engines, engine_for
from app.core.db.tables import Blob, DataKey, ModelVersion, Sample, ShortKey
from app.core.settings import Settings
from app.core.storage.blobs import blobs
from app.core.storage.crypto import Keyring, SealError, open_sealed, seal
from app.core.storage.objects import S3Objects
from app.main import create_app
from tests.conftest import Api, make_keys
from workers.statistics import read_vectors

CONFIG = {"epochs": 5, "batch_size": 64, "learning_rate": 0.05, "weight_decay": 1e-3, "seed": 0}
N = 240


def person_dataset(api: Api) -> dict:
    """Distinctive ids and subjects (long enough that a byte search cannot hit by chance)."""
    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    np.savez(
        buf,
        X=rng.normal(size=(N, 16)).astype(np.float32),
        y=rng.integers(0, 3, N),
        ids=np.array([f"sample-{i:04d}-of-person-{i % 40:02d}-zq" for i in range(N)]),
        subjects=np.array([f"subject-person-{i % 40:02d}-zq" for i in range(N)]),
        split=np.array(["train"] * 200 + ["test"] * 40),
    )
    response = api.post("/v1/datasets", files={"file": ("people.npz", buf.getvalue())})
    assert response.status_code == 201, response.text
    return response.json() | {"X": np.load(io.BytesIO(buf.getvalue()))["X"]}


def recollection_model(api: Api, dataset_id: int) -> dict:
    created = api.post(
        "/v1/models",
        json={
            "name": "people",
            "dataset_id": dataset_id,
            "architecture": {"type": "logreg"},
            "training": CONFIG,
            "method": {"name": "recollection", "max_relative_noise": None, "evaluate": True},
        },
    )
    assert created.status_code == 202, created.text
    model = api.wait(f"/v1/models/{created.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return model


def database_bytes(url: str) -> bytes:
    """Every byte of Lethe's data in the database files, as a file reader would see it."""
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        return b"".join(
            p.read_bytes() for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")) if p.exists()
        )
    engine = engine_for(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pageinspect")
        relations = conn.execute(
            sa.text(
                """
                WITH t AS (SELECT reltoastrelid AS toast FROM pg_class
                           WHERE relnamespace = 'public'::regnamespace AND relkind = 'r'
                             AND reltoastrelid <> 0)
                SELECT oid::regclass::text FROM pg_class
                 WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'i')
                UNION SELECT toast::regclass::text FROM t
                UNION SELECT indexrelid::regclass::text FROM pg_index
                 WHERE indrelid IN (SELECT toast FROM t)
                """
            )
        ).scalars()
        pages = []
        for rel in relations:
            blocks = conn.execute(
                sa.text("SELECT pg_relation_size(CAST(:r AS regclass)) / 8192"), {"r": rel}
            ).scalar_one()
            for block in range(blocks):
                pages.append(
                    conn.execute(
                        sa.text("SELECT get_raw_page(:r, 'main', :b)"), {"r": rel, "b": block}
                    ).scalar_one()
                )
    return b"".join(bytes(p) for p in pages)


def wait_until_absent(url: str, needles: dict[str, bytes], timeout: float = 120.0) -> bytes:
    """Compaction runs right after the erasure commits, and again while an older transaction
    keeps destroyed rows visible: poll until it has, then insist (`timeout` only bounds a hang;
    20 s ran out on a busy machine while compaction was still retrying)."""
    deadline = time.monotonic() + timeout
    while True:
        haystack = database_bytes(url)
        found = [name for name, needle in needles.items() if needle in haystack]
        if not found or time.monotonic() > deadline:
            assert not found, f"still in the database files: {found}"
            return haystack
        time.sleep(0.2)


def test_byte_search_finds_nothing_of_an_erased_person(api: Api) -> None:
    """The database files and the blob folder (the embedded default's object store)."""
    folder = api.runtime.settings.resolved_blob_dir
    byte_search_scenario(api, lambda: folder_bytes(folder))


def test_byte_search_covers_the_bucket(tmp_path: Path, s3_settings: dict, seaweed) -> None:
    """Blobs in S3 (SeaweedFS): every object of the bucket as a client reads it, and the
    server's own volume files on disk, where a deleted object's bytes may linger."""
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'lethe.db'}",
        redis_url=None,
        reconcile_seconds=0.5,
        bootstrap_admin_key=False,
        **s3_settings,
    )
    upgrade_to_head(settings.resolved_database_url)
    with TestClient(create_app(settings)) as client:
        api = Api(client, settings.resolved_database_url, make_keys(settings.resolved_database_url))
        store = blobs(settings).store
        assert isinstance(store, S3Objects)

        def bucket_bytes() -> bytes:
            objects = [o.key for o in store.listing()]
            return b"".join(b"".join(store.read(k, 0, 1 << 40)) for k in objects)

        byte_search_scenario(api, lambda: bucket_bytes() + folder_bytes(seaweed.folder))


def folder_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def byte_search_scenario(api: Api, stored_bytes: Callable[[], bytes]) -> None:
    """A person's samples, statistics, ids and the weights trained on them: found nowhere
    (database files, `stored_bytes()`) in plaintext, and after the person's deletion not
    even the wrapped keys are."""
    ds = person_dataset(api)
    model = recollection_model(api, ds["id"])
    ring = api.runtime.keyring
    person = "subject-person-07-zq"
    members = [i for i in range(200) if i % 40 == 7]  # the person's 5 training samples
    raw_ids = [f"sample-{i:04d}-of-person-07-zq" for i in members]
    weights_v1 = api.get(f"/v1/models/{model['id']}/weights").content

    with database(api.url).read() as session:
        tokens = [ring.token("sample", ds["id"], x) for x in raw_ids]
        rows = session.execute(
            select(Sample.id, Sample.key_id).where(Sample.external_id.in_(tokens))
        ).all()
        assert len(rows) == 5
        erased_keys = {
            k: w
            for k, w in session.execute(
                select(DataKey.id, DataKey.wrapped).where(DataKey.id.in_([r.key_id for r in rows]))
            )
        }
        vectors = read_vectors(session, api.runtime.keyring, model["id"], [r.id for r in rows])
        v1 = session.scalar(select(ModelVersion).where(ModelVersion.model_id == model["id"]))
        blob_key_ids = session.scalars(
            select(Blob.key_id).where(Blob.key.in_([v1.weights_key, v1.state_key]))
        ).all()
        blob_keys = {
            k: w
            for k, w in session.execute(
                select(ShortKey.id, ShortKey.wrapped).where(ShortKey.id.in_(blob_key_ids))
            )
        }
        kept_id = session.execute(  # another person's sample: the subject's test sample goes too
            select(Sample.id)
            .where(
                Sample.dataset_id == ds["id"],
                Sample.subject_id != ring.token("subject", ds["id"], person),
            )
            .order_by(Sample.id)
            .limit(1)
        ).scalar_one()
    assert len(vectors) == 5 and len(blob_keys) == 2

    plaintext = {
        **{f"features of {x}": ds["X"][i].tobytes() for x, i in zip(raw_ids, members, strict=True)},
        **{f"statistic of {s}": v.numpy().tobytes()[:64] for s, v in vectors.items()},
        "v1 weights": weights_v1[-256:],
        **{f"id {x}": x.encode() for x in raw_ids},
        "subject id": person.encode(),
    }
    keys = {
        **{f"sample key {k}": w for k, w in erased_keys.items()},
        **{f"blob key {k}": w for k, w in blob_keys.items()},
    }
    before = database_bytes(api.url)
    assert not [name for name, needle in plaintext.items() if needle in before]
    objects = stored_bytes()
    assert len(objects) > len(weights_v1), "the search must see the stored blobs"
    assert not [name for name, needle in {**plaintext, **keys}.items() if needle in objects]
    assert all(w in before for w in keys.values()), "the search must see the keys before"

    listed = api.get(f"/v1/datasets/{ds['id']}/samples", params={"subject": person}).json()
    assert sorted(s["external_id"] for s in listed["items"]) == sorted(
        raw_ids + [f"sample-{i:04d}-of-person-07-zq" for i in range(200, N) if i % 40 == 7]
    )

    request = api.post(
        "/v1/deletions", role="requester", json={"dataset_id": ds["id"], "subject_ids": [person]}
    ).json()
    done = api.wait(f"/v1/deletions/{request['id']}", ("done", "failed"))
    assert done["status"] == "done", done
    assert api.get(f"/v1/models/{model['id']}/versions/1/weights").status_code == 410

    after = wait_until_absent(api.url, {**plaintext, **keys})
    with database(api.url).read() as session:  # its block's key now: the old one sealed an
        kept = session.execute(  # erased row too, so the erasure sealed the block anew
            select(DataKey.wrapped)
            .join(Sample, Sample.key_id == DataKey.id)
            .where(Sample.id == kept_id)
        ).scalar_one()
    assert kept in after, "control: a retained sample's key is still found"
    objects = stored_bytes()
    assert not [name for name, needle in {**plaintext, **keys}.items() if needle in objects]

    listed = api.get(f"/v1/datasets/{ds['id']}/samples", params={"subject": person}).json()
    assert listed["total"] == 0 and listed["items"] == []
    erased = api.get(
        f"/v1/datasets/{ds['id']}/samples", params={"status": "erased", "limit": 100}
    ).json()
    assert erased["total"] == 6  # 5 train + 1 test sample
    assert all(s["external_id"] is None and s["label"] is None for s in erased["items"])
    stored = api.get(f"/v1/deletions/{request['id']}", role="auditor").json()
    assert stored["selector"]["subject_ids"] == [ring.token("subject", ds["id"], person)]


def test_byte_search_with_the_worker_process(tmp_path: Path) -> None:
    """`lethe serve`'s default: the update, the erasure and its compaction run in the API's
    worker process; the database files and blobs keep nothing either."""
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'lethe.db'}",
        redis_url=None,
        embedded_worker="process",
        bootstrap_admin_key=False,
        reconcile_seconds=0.5,
    )
    upgrade_to_head(settings.resolved_database_url)
    with TestClient(create_app(settings)) as client:
        assert client.app.state.dispatcher.pid not in (None, os.getpid())
        api = Api(client, settings.resolved_database_url, make_keys(settings.resolved_database_url))
        byte_search_scenario(api, lambda: folder_bytes(settings.resolved_blob_dir))


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_sqlite_keeps_nothing_after_a_clean_stop(tmp_path: Path, worker: str) -> None:
    """The service also leaves nothing once stopped (the WAL is checkpointed and gone), with
    the embedded worker a thread or a process of its own."""
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'lethe.db'}",
        redis_url=None,
        embedded_worker=worker,
        bootstrap_admin_key=False,
        reconcile_seconds=0.5,
    )
    upgrade_to_head(settings.resolved_database_url)
    app = create_app(settings)
    with TestClient(app) as client:
        api = Api(client, settings.resolved_database_url, make_keys(settings.resolved_database_url))
        ds = person_dataset(api)
        model = recollection_model(api, ds["id"])
        with database(api.url).read() as session:
            v1 = session.scalar(select(ModelVersion).where(ModelVersion.model_id == model["id"]))
            wrapped = session.scalar(
                select(ShortKey.wrapped)
                .join(Blob, Blob.key_id == ShortKey.id)
                .where(Blob.key == v1.weights_key)
            )
        request = api.post(
            "/v1/deletions",
            role="requester",
            json={"dataset_id": ds["id"], "sample_ids": ["sample-0003-of-person-03-zq"]},
        ).json()
        assert api.wait(f"/v1/deletions/{request['id']}", ("done", "failed"))["status"] == "done"
    dispose_engines(api.url)
    assert wrapped not in database_bytes(api.url)
    assert (
        not Path(f"{api.url.removeprefix('sqlite:///')}-wal").exists()
        or not Path(f"{api.url.removeprefix('sqlite:///')}-wal").stat().st_size
    )


def test_every_sqlite_connection_zeroes_freed_cells(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    for readonly in (False, True):
        with engine_for(url, readonly=readonly).connect() as conn:
            assert conn.exec_driver_sql("PRAGMA secure_delete").scalar_one() == 1
    dispose_engines(url)


def test_requesters_see_only_their_own_requests(api: Api, digits: dict, ready_model: dict) -> None:
    other = make_keys(api.url)["requester"]
    first = api.get(f"/v1/datasets/{digits['id']}/samples", params={"limit": 1}).json()
    sent = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": digits["id"], "sample_ids": [first["items"][0]["external_id"]]},
    ).json()
    path = f"/v1/deletions/{sent['id']}"
    assert api.get(path, role="requester").status_code == 200
    assert api.get(path, role="auditor").status_code == 200
    assert api.get(path).status_code == 200
    theirs = api.client.get(path, headers={"Authorization": f"Bearer {other}"})
    assert theirs.status_code == 404 and theirs.json()["error"]["code"] == "deletion_not_found"


def test_forget_set_metrics_are_for_admins_and_auditors(api: Api) -> None:
    ds = person_dataset(api)
    model = recollection_model(api, ds["id"])
    request = api.post(
        "/v1/deletions",
        role="requester",
        json={"dataset_id": ds["id"], "sample_ids": ["sample-0001-of-person-01-zq"]},
    ).json()
    assert api.wait(f"/v1/deletions/{request['id']}", ("done", "failed"))["status"] == "done"
    path = f"/v1/models/{model['id']}/versions/2"
    for role in ("admin", "auditor"):
        evaluation = api.get(path, role=role).json()["metrics"]["evaluation"]
        assert "forget_accuracy" in evaluation and "mia_auc" in evaluation
    for role in ("reader", "requester"):
        text = api.get(path, role=role).text
        assert "forget_accuracy" not in text and "mia_auc" not in text
        assert "test_accuracy" in text
        whole = api.get(f"/v1/models/{model['id']}", role=role).text
        assert "forget_accuracy" not in whole


def test_access_log_keeps_no_query_string() -> None:
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5", "GET", "/v1/datasets/1/samples?subject=person-7", "1.1", 200),
        None,
    )
    assert DropQueryString().filter(record)
    assert "person-7" not in record.getMessage()
    assert "/v1/datasets/1/samples" in record.getMessage()


def test_another_master_key_refuses_to_open() -> None:
    """A worker with another master key fails loudly instead of reading garbage."""
    a, b = Keyring(b"a" * 32), Keyring(b"b" * 32)
    raw, wrapped = a.new_data_key()
    assert a.unwrap(wrapped) == raw
    with pytest.raises(SealError, match="LETHE_MASTER_KEY"):
        b.unwrap(wrapped)
    sealed = seal(raw, b"features", "sample/1/t:x")
    with pytest.raises(SealError):
        open_sealed(raw, sealed, "sample/1/t:y")  # bound to what it belongs to
