"""sharded_retrain's shards across the worker pool (workers/shards.py), with real PostgreSQL,
Redis, SeaweedFS and `lethe worker` processes: a helper killed mid-shard costs a lease, not the
update, and the ensemble is the same bits wherever its shards ran."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
from redis import Redis
from safetensors.torch import load as load_tensors
from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import Certificate, DeletionTask
from app.core.dispatch import deletions_queue
from tests.conftest import SMALL_TRAINING, truncate_all
from tests.integration.test_pipeline_distributed import (
    FAST,
    assert_single_chain,
    train_ids,
    wait_until,
)
from tests.support.cluster import Cluster

pytestmark = pytest.mark.integration

METHOD = {"name": "sharded_retrain", "shards": 4, "slices": 2}
POINTS = ("shards-published", "shard-task")  # the parent's, after queueing; a helper's


def sharded_model(c: httpx.Client) -> tuple[dict, dict]:
    ds = c.post("/v1/datasets", json={"builtin": "digits"}).json()
    body = {"name": "s", "dataset_id": ds["id"], "training": SMALL_TRAINING, "method": METHOD}
    created = c.post("/v1/models", json=body)
    assert created.status_code == 202, created.text
    return ds, created.json()


def ready(c: httpx.Client, model_id: int) -> None:
    wait_until(lambda: c.get(f"/v1/models/{model_id}").json()["status"] in ("ready", "failed"))
    model = c.get(f"/v1/models/{model_id}").json()
    assert model["status"] == "ready", model.get("error")


def done(c: httpx.Client, request_id: str) -> dict:
    def finished() -> bool:
        return c.get(f"/v1/deletions/{request_id}").json()["status"] in ("done", "failed")

    wait_until(finished, timeout=240)
    return c.get(f"/v1/deletions/{request_id}").json()


def weights_digest(c: httpx.Client, model_id: int, number: int) -> str:
    """The released tensors' bytes, by name (the file's metadata names its model)."""
    response = c.get(f"/v1/models/{model_id}/versions/{number}/weights")
    assert response.status_code == 200, response.text
    tensors = load_tensors(response.content)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode() + tensors[name].numpy().tobytes())
    return digest.hexdigest()


def helped(cluster: Cluster, model_id: int) -> int:
    """Shard tasks of the model's rounds that helpers computed, by the workers' logs."""
    logs = "".join(p.read_text() for p in cluster.data_dir.glob("worker-*.log"))
    return logs.count(f"of model {model_id}'s round")


def helper_jobs(cluster: Cluster, model_id: int) -> list[int]:
    """Helper jobs each worker has started for the model, by its log (RQ logs each start)."""
    job = f"help_shards', {model_id}, "
    logs = sorted(cluster.data_dir.glob("worker-*.log"))
    return [
        sum(job in line and "Successfully" not in line for line in p.read_text().splitlines())
        for p in logs
    ]


@pytest.mark.long
def test_a_helper_killed_mid_shard_costs_a_lease_and_the_ensemble_is_the_same_bits(
    pg_url: str, redis_url: str, tmp_path: Path, s3_settings: dict[str, object]
) -> None:
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    truncate_all(pg_url)
    settings = {**FAST, **s3_settings, "pause_dir": pauses, "pause_at": list(POINTS)}
    with Cluster(tmp_path / "c", pg_url, redis_url, **settings) as cluster:
        try:
            _kill_a_helper(cluster, pauses, pg_url)
        finally:
            cluster.stop()
            queues = (cluster.queue, deletions_queue(cluster.queue))
            Redis.from_url(redis_url).delete(*(f"rq:queue:{q}" for q in queues))


def _kill_a_helper(cluster: Cluster, pauses: Path, pg_url: str) -> None:
    cluster.start_api()
    for _ in range(3):
        cluster.start_worker()
    with cluster.client() as c:
        # Two copies of one dataset, one model each: a deletion reaches only its dataset's
        # model, and the same rows and seeds give the same ensemble (by external id).
        (ds_a, a), (ds_b, b) = sharded_model(c), sharded_model(c)
        for model in (a, b):  # every point open while they train
            for name in POINTS:
                (pauses / f"{name}-{model['id']}.go").touch()
        ready(c, a["id"])
        ready(c, b["id"])
        assert weights_digest(c, a["id"], 1) == weights_digest(c, b["id"], 1)
        for name in POINTS:  # A's next round stops at both points
            (pauses / f"{name}-{a['id']}.go").unlink()
            (pauses / f"{name}-{a['id']}.reached").unlink(missing_ok=True)
        gone = train_ids(c, ds_a["id"], 40)  # every shard, all but surely: a helper for each
        before, started = helped(cluster, a["id"]), helper_jobs(cluster, a["id"])
        req = c.post("/v1/deletions", json={"dataset_id": ds_a["id"], "sample_ids": gone}).json()
        parent = pauses / f"shards-published-{a['id']}.reached"
        helper = pauses / f"shard-task-{a['id']}.reached"

        def two_helpers_claiming() -> bool:  # both other workers took a helper job
            now = helper_jobs(cluster, a["id"])
            return sum(n > b for n, b in zip(now, started, strict=True)) == 2

        wait_until(lambda: parent.exists() and helper.exists(), every=0.02)
        wait_until(two_helpers_claiming, every=0.02)
        helper_pid = int(helper.read_text())
        assert helper_pid != int(parent.read_text())  # the task is on another worker
        cluster.kill(cluster.worker_by_pid(helper_pid))  # kill -9 with its task claimed
        helper.unlink()
        (pauses / f"shard-task-{a['id']}.go").touch()  # the third worker helps as it comes
        (pauses / f"shards-published-{a['id']}.go").touch()
        finished = done(c, req["id"])
        assert finished["status"] == "done", finished
        other = c.post("/v1/deletions", json={"dataset_id": ds_b["id"], "sample_ids": gone})
        assert done(c, other.json()["id"])["status"] == "done"
        cert = c.get(f"/v1/audit/certificates/{finished['certificate_ids'][0]}").json()
        assert len(cert["sharding"]["retrained"]) >= 3  # two helpers: one killed, one not
        assert helped(cluster, a["id"]) > before  # the survivor's result is in A's ensemble
        assert weights_digest(c, a["id"], 2) == weights_digest(c, b["id"], 2)
    assert len(assert_single_chain(pg_url, a["id"])) == 2
    with database(pg_url).read() as session:
        assert session.scalar(select(func.count()).select_from(Certificate)) == 2  # A's, B's
        attempts = session.scalars(select(DeletionTask.attempts)).all()
    assert sorted(attempts) == [1, 1]  # the kill cost A's update no attempt
