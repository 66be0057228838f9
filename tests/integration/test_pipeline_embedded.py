"""The embedded mode keeps the pipeline's guarantees: a real `lethe serve` process on a
SQLite file with its inline worker, concurrent clients, one chain, one certificate each."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.integration.test_pipeline_distributed import ready_model, train_ids, wait_until
from tests.support.cluster import Cluster


def test_concurrent_requests_form_one_chain_embedded(tmp_path: Path) -> None:
    with Cluster(tmp_path, None, None, reconcile_seconds=0.5) as cluster:
        cluster.start_api()
        with cluster.client() as c:
            ds, model = ready_model(c, "breast_cancer")
            ids = train_ids(c, ds["id"], 120)

        def post(chunk: list[str]) -> list[int]:
            with cluster.client() as rc:
                return [
                    rc.post(
                        "/v1/deletions", json={"dataset_id": ds["id"], "sample_ids": [s]}
                    ).json()["id"]
                    for s in chunk
                ]

        with ThreadPoolExecutor(8) as pool:
            request_ids = [
                i for part in pool.map(post, [ids[k::8] for k in range(8)]) for i in part
            ]
        db = sqlite3.connect(tmp_path / "lethe.db")

        def all_done() -> bool:
            return (
                db.execute(
                    "SELECT count(*) FROM deletion_requests WHERE status = 'done'"
                ).fetchone()[0]
                == 120
            )

        wait_until(all_done, timeout=180)
        versions = db.execute(
            "SELECT id, number, parent_id FROM model_versions WHERE model_id = ? ORDER BY number",
            (model["id"],),
        ).fetchall()
        assert [v[1] for v in versions] == list(range(1, len(versions) + 1))
        assert all(cur[2] == prev[0] for prev, cur in zip(versions, versions[1:], strict=False))
        per_request = db.execute(
            "SELECT request_id, count(*) FROM certificates GROUP BY request_id"
        ).fetchall()
        assert sorted(r for r, _ in per_request) == sorted(request_ids)
        assert {n for _, n in per_request} == {1}
        assert db.execute("SELECT sum(n_removed) FROM certificates").fetchone()[0] == 120
        with cluster.client() as c:
            assert c.get("/v1/audit/verify").json()["ok"]
