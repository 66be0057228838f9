"""What a byte search of the database files finds after a person is deleted (issue 11).

Runs the service in process (embedded worker) on SQLite and on a fresh PostgreSQL database,
registers 240 samples with distinctive ids (6 of them belong to `subject-person-07-zq`),
trains a recollection model, deletes the subject, and counts the copies of the person's
features, sample ids, subject id and the purged v1 weights left in the database files
(SQLite main file + WAL, also after a clean stop; PostgreSQL heap, index and TOAST pages
through pageinspect). It uses only the HTTP API, so the same script measures older commits:

    .venv/bin/python -m bench.byte_search                       # this checkout
    cd /tmp/old && PYTHONPATH=. /work/main/.venv/bin/python /work/main/bench/byte_search.py

Writes bench/results/byte_search.json (of the checkout it runs in).
"""

from __future__ import annotations

import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from fastapi.testclient import TestClient

from app.db.migrate import upgrade_to_head
from app.db.session import database, engine_for
from app.main import create_app
from app.security import Role, create_key
from app.settings import Settings
from bench.common import scratch_database, write_result

N = 240
PERSON = "subject-person-07-zq"
TRAINING = {"epochs": 5, "batch_size": 64, "learning_rate": 0.05, "weight_decay": 1e-3, "seed": 0}


def dataset() -> tuple[np.ndarray, bytes]:
    rng = np.random.default_rng(7)
    X = rng.normal(size=(N, 16)).astype(np.float32)
    buf = io.BytesIO()
    np.savez(
        buf,
        X=X,
        y=rng.integers(0, 3, N),
        ids=np.array([f"sample-{i:04d}-of-person-{i % 40:02d}-zq" for i in range(N)]),
        subjects=np.array([f"subject-person-{i % 40:02d}-zq" for i in range(N)]),
        split=np.array(["train"] * 200 + ["test"] * 40),
    )
    return X, buf.getvalue()


def file_bytes(url: str) -> bytes:
    if url.startswith("sqlite"):
        path = Path(url.removeprefix("sqlite:///"))
        return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())
    pages = []
    with engine_for(url).begin() as conn:
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pageinspect")
        relations = conn.execute(
            sa.text(
                "WITH t AS (SELECT reltoastrelid AS toast FROM pg_class WHERE relnamespace ="
                " 'public'::regnamespace AND relkind = 'r' AND reltoastrelid <> 0)"
                " SELECT oid::regclass::text FROM pg_class WHERE relnamespace ="
                " 'public'::regnamespace AND relkind IN ('r', 'i')"
                " UNION SELECT toast::regclass::text FROM t"
            )
        ).scalars()
        for rel in list(relations):
            size = sa.text("SELECT pg_relation_size(CAST(:r AS regclass)) / 8192")
            for block in range(conn.execute(size, {"r": rel}).scalar_one()):
                page = sa.text("SELECT get_raw_page(:r, 'main', :b)")
                pages.append(bytes(conn.execute(page, {"r": rel, "b": block}).scalar_one()))
    return b"".join(pages)


def count(haystack: bytes, X: np.ndarray, weights: bytes) -> dict[str, int]:
    members = [i for i in range(N) if i % 40 == 7]
    return {
        "features_of_6_samples": sum(haystack.count(X[i].tobytes()) for i in members),
        "ids_of_6_samples": sum(
            haystack.count(f"sample-{i:04d}-of-person-07-zq".encode()) for i in members
        ),
        "subject_id": haystack.count(PERSON.encode()),
        "v1_weights_last_256_bytes": haystack.count(weights[-256:]),
    }


def measure(url: str, data_dir: Path) -> dict[str, dict[str, int]]:
    X, npz = dataset()
    upgrade_to_head(url)
    settings = Settings(
        data_dir=data_dir, database_url=url, redis_url=None, bootstrap_admin_key=False
    )
    out: dict[str, dict[str, int]] = {}
    with TestClient(create_app(settings)) as client:
        with database(url).write() as session:
            h = {"Authorization": f"Bearer {create_key(session, Role.admin, 'bench')[1]}"}
        ds = client.post("/v1/datasets", files={"file": ("p.npz", npz)}, headers=h).json()
        while ds["status"] == "registering":  # past 10,000 rows: a job (issue 55)
            time.sleep(0.2)
            ds = client.get(f"/v1/datasets/{ds['id']}", headers=h).json()
        body = {
            "name": "m",
            "dataset_id": ds["id"],
            "architecture": {"type": "logreg"},
            "training": TRAINING,
            "method": {"name": "recollection", "max_relative_noise": None},
        }
        model = client.post("/v1/models", headers=h, json=body).json()
        while client.get(f"/v1/models/{model['id']}", headers=h).json()["status"] == "queued":
            time.sleep(0.2)
        while client.get(f"/v1/models/{model['id']}", headers=h).json()["status"] == "training":
            time.sleep(0.2)
        weights = client.get(f"/v1/models/{model['id']}/weights", headers=h).content
        out["before_deletion"] = count(file_bytes(url), X, weights)
        request = client.post(
            "/v1/deletions", headers=h, json={"dataset_id": ds["id"], "subject_ids": [PERSON]}
        ).json()
        path = f"/v1/deletions/{request['id']}"
        while client.get(path, headers=h).json()["status"] not in ("done", "failed"):
            time.sleep(0.2)
        time.sleep(2)  # compaction runs right after the commit
        out["after_deletion"] = count(file_bytes(url), X, weights)
    if url.startswith("sqlite"):
        engine_for(url).dispose()
        out["after_clean_stop"] = count(file_bytes(url), X, weights)
    return out


def main() -> None:
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = measure(f"sqlite:///{Path(tmp) / 'lethe.db'}", Path(tmp))
        with scratch_database("lethe_bytes", migrate=False) as url:
            results["postgresql"] = measure(url, Path(tmp))
    print(json.dumps(results, indent=1))
    write_result("byte_search", results)  # into the bench/results of the code measured


if __name__ == "__main__":
    main()
