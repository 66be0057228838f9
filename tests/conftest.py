"""Fixtures: every API test runs on a real SQLite file and on the real PostgreSQL server.

PostgreSQL gets one fresh database per test session, migrated to head with Alembic; tables
are truncated between tests (jobs commit from worker threads, so a rolled-back outer
transaction, as in Polar's fixtures, cannot hold them).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database, engine_for
from app.core.db.tables import Base
from app.core.runtime import Runtime
from app.core.security import Role, create_key
from app.core.settings import Settings
from app.main import create_app
from tests.support.databases import finish_drops, own_database
from tests.support.servers import S3_ACCESS_KEY, S3_SECRET_KEY, RedisServer, SeaweedServer

# Apps made in the test process run their embedded worker as a thread, so that tests may patch
# a job in-process; every `lethe serve` a test starts (tests/support/cluster.py,
# tests/integration/test_e2e.py) gets the product's default, a worker process
# (tests/integration/test_worker_process.py).
os.environ.setdefault("LETHE_EMBEDDED_WORKER", "thread")
# MLflow's client reports usage from a thread and keeps a session id in os.environ, which a
# test that restores the environment removes (test_mlflow then failed with a KeyError on it);
# no test needs it, and nothing here may reach the internet
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# The restore journal's default place is the user's state folder: the suite's journals go to a
# folder of its own (each database's in its own subfolder), not into the home folder
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="lethe-test-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], True)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A redis-server of our own on a free port: tests may FLUSHALL it, nobody else's."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server.url
    server.kill()


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """SeaweedFS of our own (`weed server -s3`) on free ports: the tests' real S3 server."""
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def s3_settings(seaweed: SeaweedServer) -> dict[str, object]:
    """Settings that keep blobs in that server's bucket under a fresh prefix (one per test:
    SeaweedFS gives every bucket volumes of its own, so buckets are not made per test)."""
    return {
        "blob_store": "s3",
        "s3_bucket": "lethe-tests",
        "s3_prefix": f"{uuid.uuid4().hex[:12]}/",
        "s3_endpoint_url": seaweed.endpoint,
        "s3_region": "us-east-1",
        "s3_access_key_id": S3_ACCESS_KEY,
        "s3_secret_access_key": S3_SECRET_KEY,
    }


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, migrated to head."""
    with own_database("lethe_test") as url:
        yield url


# The sequences that the tables' ids draw from (serial and identity columns own theirs).
_OWNED_SEQUENCES = (
    "SELECT s.oid::regclass::text FROM pg_class s JOIN pg_depend d ON d.objid = s.oid "
    "WHERE s.relkind = 'S' AND d.classid = 'pg_class'::regclass "
    "AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')"
)


def truncate_all(url: str) -> None:
    """Empty every table and restart the ids, as `TRUNCATE ... RESTART IDENTITY` would: one
    DELETE per table with triggers and foreign-key checks off (`session_replication_role`,
    so the append-only tables' triggers let it), then the owned sequences restarted.
    TRUNCATE made new files for every relation, data_keys' 128 partitions among them: half a
    second before each PostgreSQL test, where these DELETEs take 20 ms."""
    with engine_for(url).begin() as conn:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")
        for table in reversed(Base.metadata.sorted_tables):
            conn.exec_driver_sql(f"DELETE FROM {table.name}")
        for sequence in conn.exec_driver_sql(_OWNED_SEQUENCES).scalars().all():
            conn.exec_driver_sql(f"ALTER SEQUENCE {sequence} RESTART")


@pytest.fixture(scope="session")
def sqlite_at_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An SQLite database migrated to head once per test process: each test's is a copy
    (running the 25 migrations for each was a tenth of the in-process tests' time)."""
    path = tmp_path_factory.mktemp("sqlite-head") / "lethe.db"
    url = f"sqlite:///{path}"
    upgrade_to_head(url)
    engine_for(url).dispose()  # the last connection checkpoints the WAL into the file
    assert not path.with_name("lethe.db-wal").exists()
    return path


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        shutil.copyfile(request.getfixturevalue("sqlite_at_head"), tmp_path / "lethe.db")
        url = f"sqlite:///{tmp_path / 'lethe.db'}"
        yield url
        engine_for(url).dispose()
    else:
        url = request.getfixturevalue("pg_url")
        truncate_all(url)
        yield url


@dataclass
class Api:
    """A running app (TestClient, embedded inline worker) and one key per role."""

    client: TestClient
    url: str
    keys: dict[str, str]

    @property
    def runtime(self) -> Runtime:
        """The app's resources (app/core/runtime.py)."""
        return self.client.app.state.runtime  # type: ignore[attr-defined,no-any-return]

    def worker(self) -> Any:
        """The inline worker's JobContext (workers/context.py; the thread-mode worker)."""
        return self.client.app.state.dispatcher.context  # type: ignore[attr-defined]

    def opened(self) -> Any:
        """A fresh cache of opened samples under the app's keyring, for reading rows."""
        from workers.data import OpenedSamples

        return OpenedSamples(self.runtime.keyring)

    def h(self, role: str = "admin") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[role]}"}

    def get(self, path: str, role: str = "admin", headers: dict | None = None, **kw):
        return self.client.get(path, headers={**self.h(role), **(headers or {})}, **kw)

    def post(self, path: str, role: str = "admin", headers: dict | None = None, **kw):
        return self.client.post(path, headers={**self.h(role), **(headers or {})}, **kw)

    def wait(self, path: str, done: tuple[str, ...], timeout: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            body = self.get(path).json()
            if body["status"] in done:
                return body
            time.sleep(0.05)
        raise AssertionError(f"{path} still {body['status']} after {timeout}s: {body}")


def make_keys(url: str) -> dict[str, str]:
    keys = {}
    with database(url).write() as session:
        for role in Role:
            keys[role.value] = create_key(session, role, f"test {role.value}")[1]
    return keys


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        database_url=db_url,
        redis_url=None,
        max_upload_bytes=2_000_000,
        reconcile_seconds=0.5,
        heartbeat_seconds=1.0,
        lease_seconds=10.0,
        bootstrap_admin_key=False,
    )


@pytest.fixture
def api(settings: Settings) -> Iterator[Api]:
    app = create_app(settings)
    with TestClient(app) as client:
        yield Api(
            client=client,
            url=settings.resolved_database_url,
            keys=make_keys(settings.resolved_database_url),
        )


@contextlib.contextmanager
def paused_app(settings: Settings, tmp_path: Path, *points: str) -> Iterator[tuple[Api, Path]]:
    """The app with these pause points switched on (app/core/pause.py), and their folder: a test
    touches `<point>-<id>.go` there to let one go on."""
    pause = tmp_path / "pause"
    pause.mkdir()
    paused = settings.model_copy(update={"pause_dir": pause, "pause_at": list(points)})
    url = paused.resolved_database_url
    with TestClient(create_app(paused)) as client:
        yield Api(client=client, url=url, keys=make_keys(url)), pause


@pytest.fixture
def paused_api(settings: Settings, tmp_path: Path) -> Iterator[tuple[Api, Path]]:
    """The app paused between a registration's chunk commits (`registration-chunk`)."""
    with paused_app(settings, tmp_path, "registration-chunk") as found:
        yield found


def train_ids(api: Api, dataset_id: int, n: int, offset: int = 0) -> list[str]:
    """The external ids of n training samples (in upload order, from `offset`)."""
    page = api.get(
        f"/v1/datasets/{dataset_id}/samples",
        params={"split": "train", "limit": n, "offset": offset},
    ).json()
    return [s["external_id"] for s in page["items"]]


SMALL_TRAINING = {"epochs": 3, "batch_size": 64, "learning_rate": 0.1, "seed": 0}


@pytest.fixture
def digits(api: Api) -> dict:
    response = api.post("/v1/datasets", json={"builtin": "digits"})
    assert response.status_code == 201, response.text
    return response.json()


@pytest.fixture
def ready_model(api: Api, digits: dict) -> dict:
    response = api.post(
        "/v1/models",
        json={
            "name": "m",
            "dataset_id": digits["id"],
            "architecture": {"type": "logreg"},
            "training": SMALL_TRAINING,
        },
    )
    assert response.status_code == 202, response.text
    return api.wait(f"/v1/models/{response.json()['id']}", ("ready", "failed"))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The PostgreSQL databases this process made are all dropped before it ends."""
    finish_drops()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses the PostgreSQL server `postgres`, and every test that starts
    SeaweedFS `integration` (for `make unit`)."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "pg_url" in names:
            item.add_marker(pytest.mark.postgres)
        params = getattr(item, "callspec", None)
        if (
            "seaweed" in names
            or "s3_settings" in names
            or (params is not None and params.params.get("store") == "s3")
        ):
            item.add_marker(pytest.mark.integration)


# after `-m` has deselected, and after the hook above has marked
@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")
def pytest_collection_modifyitems_long_first(
    config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Each test process starts with its share of the long tests (`@pytest.mark.long`).
    pytest-xdist's worksteal hands each process a contiguous share of this list and lets the
    idle ones take from the ends of the others' shares: a long test at the end of a share
    started late and ran alone at the end of the suite. So the long tests are dealt out, in
    order, to the fronts of the shares, whose sizes are worksteal's (every process collects
    the same order)."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    if workers < 2:
        return
    long = [item for item in items if item.get_closest_marker("long")]
    rest = [item for item in items if not item.get_closest_marker("long")]
    sizes, left = [], len(items)
    for share in range(workers):  # xdist/scheduler/worksteal.py: check_schedule
        sizes.append(left // (workers - share))
        left -= sizes[-1]
    ordered: list[pytest.Item] = []
    for share, size in enumerate(sizes):
        front = long[share::workers][:size]
        ordered += front + rest[: size - len(front)]
        del rest[: size - len(front)]
    leftover = [item for item in long if item not in ordered]
    items[:] = ordered + leftover + rest
