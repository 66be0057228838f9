"""Datasets read from object storage, against a real S3 server
(SeaweedFS): `{"source": {"s3": {"bucket", "key"}}}` with the column mapping, read by the
registration's child through Lethe's own S3 settings; Parquet by ranged GETs."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fastapi.testclient import TestClient

from app.core.db.migrate import upgrade_to_head
from app.core.formats.s3 import open_object
from app.core.settings import Settings
from app.main import create_app
from tests.conftest import Api, make_keys

BUCKET = "lethe-sources"


def settings_for(tmp_path: Path, s3: dict) -> Settings:
    """The S3 endpoint and keys Lethe is configured with; its blobs stay on disk."""
    where = {k: v for k, v in s3.items() if k != "blob_store"}
    return Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'lethe.db'}",
        redis_url=None,
        reconcile_seconds=0.5,
        bootstrap_admin_key=False,
        **where,
    )


def put(settings: Settings, key: str, data: bytes) -> None:
    from app.core.formats.s3 import s3_client

    client = s3_client(settings)
    buckets = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if BUCKET not in buckets:
        client.create_bucket(Bucket=BUCKET)
    client.put_object(Bucket=BUCKET, Key=key, Body=data)


def people(n: int = 3000) -> pa.Table:
    X = np.random.default_rng(4).standard_normal((n, 8)).astype(np.float32)
    return pa.table(
        {
            "key": [f"row-{i}" for i in range(n)],
            "who": [f"person-{i // 10}" for i in range(n)],
            "target": (X[:, 0] + X[:, 1] > 0).astype(np.int64),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), 8),
        }
    )


def test_a_parquet_object_is_registered_from_s3_a_row_group_at_a_time(
    tmp_path: Path, s3_settings: dict, seaweed
) -> None:
    settings = settings_for(tmp_path, s3_settings)
    buf = io.BytesIO()
    pq.write_table(people(), buf, row_group_size=500)
    key = f"{s3_settings['s3_prefix']}exports/people.parquet"
    put(settings, key, buf.getvalue())

    found = open_object(settings, BUCKET, key)  # ranged reads: the footer, then row groups
    assert found.size == len(buf.getvalue())
    reads = []
    client_get = found.client.get_object
    found.client.get_object = lambda **kw: reads.append(kw["Range"]) or client_get(**kw)
    assert pq.ParquetFile(found).metadata.num_rows == 3000
    assert reads and all(r.startswith("bytes=") for r in reads)
    assert sum(int(b) - int(a) + 1 for a, b in (r[6:].split("-") for r in reads)) < found.size

    upgrade_to_head(settings.resolved_database_url)
    with TestClient(create_app(settings)) as client:
        api = Api(client, settings.resolved_database_url, make_keys(settings.resolved_database_url))
        body = {
            "source": {"s3": {"bucket": BUCKET, "key": key}},
            "label_column": "target",
            "id_column": "key",
            "subject_column": "who",
        }
        made = api.post("/v1/datasets", json=body)
        assert made.status_code == 201, made.text
        assert made.json()["source"] == "s3:parquet" and made.json()["n_samples"] == 3000
        assert made.json()["feature_shape"] == [8] and made.json()["name"].endswith(
            "people.parquet"
        )
        who = api.get(f"/v1/datasets/{made.json()['id']}/samples", params={"subject": "person-7"})
        assert {s["external_id"] for s in who.json()["items"]} == {
            f"row-{i}" for i in range(70, 80)
        }

        rows = ["id,a,b,label"] + [f"r{i},{i % 5},{i % 3},{i % 2}" for i in range(40)]
        put(settings, f"{s3_settings['s3_prefix']}t.csv", "\n".join(rows).encode())
        csv = {"source": {"s3": {"bucket": BUCKET, "key": f"{s3_settings['s3_prefix']}t.csv"}}}
        from_csv = api.post("/v1/datasets", json={**csv, "id_column": "id"})
        assert from_csv.status_code == 201 and from_csv.json()["source"] == "s3:csv"

        missing = api.post(
            "/v1/datasets", json={"source": {"s3": {"bucket": BUCKET, "key": "no/such.parquet"}}}
        )
        assert missing.status_code == 422, missing.text
        assert missing.json()["error"]["code"] == "source_not_found"
        assert missing.json()["error"]["details"] == {"bucket": BUCKET, "key": "no/such.parquet"}
        mapped_wrong = api.post("/v1/datasets", json={**body, "id_column": "nope"})
        assert mapped_wrong.status_code == 422
        assert mapped_wrong.json()["error"]["details"]["column"] == "nope"
        bad = api.post("/v1/datasets", json={"source": {"s3": {"bucket": "X", "key": ""}}})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
        listed = api.get("/v1/datasets").json()
        assert listed["total"] == 2  # the refused ones left nothing
