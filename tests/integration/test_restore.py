"""Restore drills: back up a service's database and blobs, erase a person, stop,
restore the backup, start. The service must notice (not ready, nothing served but health and
deletions), `lethe restore` must put the log back as published and re-apply the erasure, and
then nothing of the person is served, no id is given twice and the log never forks: the tree
at every size published before is the tree the log continues."""

from __future__ import annotations

import io
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy import make_url
from typer.testing import CliRunner

from app.cli import app as cli
from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database
from app.core.ledger import merkle, notes
from app.core.ledger.journal import Journal
from app.core.services.restore import verdict
from app.core.settings import Settings
from app.main import create_app
from tests.conftest import Api, make_keys
from tests.integration.test_log import _seed, _vkey_of
from tests.support.cluster import LETHE, wait_for
from tests.support.databases import PG_ADMIN_URL, own_database
from tests.support.servers import free_port

PERSON = "personKQJ07"


def csv_rows() -> bytes:
    rng = np.random.default_rng(3)
    X = rng.standard_normal((120, 4))
    y = (X @ np.array([1.0, -1.0, 0.5, 0.0]) > 0).astype(int)
    lines = ["id,subject,f0,f1,f2,f3,label,split"]
    for i, (x, label) in enumerate(zip(X, y, strict=True)):
        split = "test" if i < 20 else "train"
        subject = f"personKQJ{i % 12:02d}"
        lines.append(
            f"QZXV-{i:04d}-ERASEME,{subject},"
            + ",".join(f"{v:.6f}" for v in x)
            + f",{label},{split}"
        )
    return "\n".join(lines).encode()


ORIGIN = "lethe.test/lethe/restored"


def settings_for(data: Path, url: str, journal: Path, witness: Witness | None) -> Settings:
    extra: dict[str, Any] = {}
    if witness is not None:
        extra = {
            "audit_signing_key": witness.log_seed,
            "log_origin": ORIGIN,
            "log_witnesses": [f"{witness.url} {witness.vkey}"],
        }
    return Settings(
        data_dir=data, database_url=url, journal_dir=journal, redis_url=None,
        reconcile_seconds=0.5, bootstrap_admin_key=False, **extra,
    )  # fmt: skip


@dataclass(frozen=True)
class Witness:
    url: str
    vkey: str
    log_seed: str


@contextmanager
def witness_for_log(where: Path) -> Iterator[Witness]:
    """`lethe witness` for a log whose key is made here: it keeps its state across the
    restore, as a witness on another machine would."""
    log_seed, seed = _seed(), _seed()
    key_file = where / "witness.key"
    key_file.write_text(seed + "\n")
    key_file.chmod(0o600)
    port = free_port()
    process = subprocess.Popen(
        [*LETHE, "witness", "--name", "witness.test/w1", "--key-file", str(key_file)]
        + ["--log", _vkey_of(log_seed, ORIGIN), "--state", str(where / "witness.json")]
        + ["--port", str(port)]
    )
    try:
        wait_for(f"http://127.0.0.1:{port}/vkey")
        vkey = _vkey_of(seed, "witness.test/w1", notes.COSIGNATURE)
        yield Witness(f"http://127.0.0.1:{port}", vkey, log_seed)
    finally:
        process.kill()
        process.wait(timeout=10)


@contextmanager
def service(settings: Settings, keys: dict[str, str] | None = None) -> Iterator[Api]:
    """The service on these settings; its API keys made on the first start (a backup taken
    after that holds them)."""
    url = settings.resolved_database_url
    with TestClient(create_app(settings)) as client:
        yield Api(client=client, url=url, keys=keys or make_keys(url))


def train(api: Api, dataset: int, method: dict[str, Any]) -> int:
    response = api.post(
        "/v1/models",
        json={
            "name": method["name"],
            "dataset_id": dataset,
            "architecture": {"type": "logreg"},
            "training": {"epochs": 5, "batch_size": 50, "learning_rate": 0.1, "seed": 0},
            "method": method,
        },
    )
    assert response.status_code == 202, response.text
    model = api.wait(f"/v1/models/{response.json()['id']}", ("ready", "failed"))
    assert model["status"] == "ready", model
    return int(model["id"])


def published_size(api: Api) -> int:
    """The size of the newest published checkpoint (0 before the first)."""
    response = api.get("/log/checkpoint", role="reader")
    if response.status_code == 404:
        return 0
    assert response.status_code == 200, response.text
    return int(response.text.splitlines()[1])


def tree_root(api: Api, size: int) -> str:
    """The certificates' tree root at `size`, as the service computes it now."""
    proof = api.get(
        "/v1/audit/proof/consistency", role="auditor", params={"first": size, "second": size}
    )
    assert proof.status_code == 200, proof.text
    return str(proof.json()["first_root"])


def sqlite_backup(live: Path, backup: Path) -> None:
    backup.mkdir()
    source, target = sqlite3.connect(live / "lethe.db"), sqlite3.connect(backup / "lethe.db")
    with target:
        source.backup(target)
    source.close()
    target.close()
    shutil.copytree(live / "blobs", backup / "blobs")


def sqlite_restore(backup: Path, live: Path) -> None:
    for name in ("lethe.db", "lethe.db-wal", "lethe.db-shm"):
        (live / name).unlink(missing_ok=True)
    shutil.copy(backup / "lethe.db", live / "lethe.db")
    shutil.rmtree(live / "blobs")
    shutil.copytree(backup / "blobs", live / "blobs")


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_restored_backup_never_brings_an_erased_person_back(tmp_path: Path, engine: str) -> None:
    live, backup, journal = tmp_path / "live", tmp_path / "backup", tmp_path / "journal"
    live.mkdir()
    with _database(engine, live) as url, _witness(engine, tmp_path) as witness:
        settings = settings_for(live, url, journal, witness)
        with service(settings) as api:
            keys = api.keys
            response = api.post(
                "/v1/datasets",
                files={"file": ("d.csv", io.BytesIO(csv_rows()))},
                data={"id_column": "id", "subject_column": "subject", "split_column": "split"},
            )
            assert response.status_code == 201, response.text
            dataset = response.json()["id"]
            retrain = train(api, dataset, {"name": "retrain"})
            convex = train(api, dataset, {"name": "convex_head", "lam": 1e-2, "R": 8.0})
            before = {
                m: api.get(f"/v1/models/{m}/weights", role="reader").content
                for m in (retrain, convex)
            }
        dump = _backup(engine, live, backup, url)
        with service(settings, keys) as api:
            done = api.post(
                "/v1/deletions",
                role="requester",
                json={"dataset_id": dataset, "subject_ids": [PERSON]},
            ).json()
            done = api.wait(f"/v1/deletions/{done['id']}", ("done", "failed"))
            assert done["status"] == "done", done
            lost_request = done["id"]
            wait_until(lambda: published_size(api) >= 2)  # both models' certificates
            published = published_size(api)
            root = tree_root(api, published)
        _restore(engine, backup, live, url, dump)

        with service(settings, keys) as api:  # behind the journal: shut, and says why
            ready = api.get("/readyz")
            assert ready.status_code == 503 and ready.json()["restore"]["state"] == "behind"
            samples = api.get(
                f"/v1/datasets/{dataset}/samples", role="reader", params={"subject": PERSON}
            )
            assert (
                samples.status_code == 503 and samples.json()["error"]["code"] == "restore_required"
            )
            assert api.get(f"/v1/models/{retrain}/weights", role="reader").status_code == 503
            assert api.get("/log/checkpoint").status_code == 503

        refused = CliRunner().invoke(cli, ["worker", "--burst"], env=_env(settings))
        assert refused.exit_code != 0 and "lethe restore" in str(refused.exception), refused
        result = CliRunner().invoke(cli, ["restore"], env=_env(settings))
        assert result.exit_code == 0, result.output
        assert '"samples": 10' in result.output and f"{lost_request}" in result.output

        with service(settings, keys) as api:
            made = _report_requests(journal)
            for request_id in made:  # deletions' reads stay open while it re-applies them
                finished = api.wait(f"/v1/deletions/{request_id}", ("done", "failed"))
                assert finished["status"] == "done", finished
            wait_until(lambda: api.get("/readyz").status_code == 200)
            listed = api.get(
                f"/v1/datasets/{dataset}/samples", role="admin", params={"subject": PERSON}
            )
            assert all(s["status"] == "erased" for s in listed.json()["items"]), listed.text
            for model in (retrain, convex):  # no model serves what it learned from the person
                now = api.get(f"/v1/models/{model}/weights", role="reader").content
                assert now != before[model]
            stub = api.get(f"/v1/deletions/{lost_request}", role="admin").json()
            assert stub["status"] == "done" and "restored from a backup" in stub["error"]
            assert all(r > lost_request for r in made)  # no id given twice
            again_uploaded = api.post(  # the backup predates the erasure: still suppressed
                "/v1/datasets",
                files={"file": ("d.csv", io.BytesIO(csv_rows()))},
                data={"id_column": "id", "subject_column": "subject", "split_column": "split"},
            )
            assert again_uploaded.status_code == 409, again_uploaded.text
            assert again_uploaded.json()["error"]["details"]["subjects"] == 1
            wait_until(lambda: published_size(api) > published)  # the log went on, published
            size = published_size(api)
            proof = api.get(
                "/v1/audit/proof/consistency",
                role="auditor",
                params={"first": published, "second": size},
            ).json()
            assert proof["first_root"] == root  # the same tree at the published size
            path = [bytes.fromhex(h) for h in proof["consistency_path"]]
            first, second = bytes.fromhex(root), bytes.fromhex(proof["second_root"])
            assert merkle.verify_consistency(published, size, path, first, second)
            assert api.get("/v1/audit/verify", role="auditor").json()["ok"] is True
        again = CliRunner().invoke(cli, ["restore"], env=_env(settings))  # nothing left to do
        assert again.exit_code == 0 and '"new_requests": []' in again.output, again.output
        with service(settings, keys) as api:
            assert api.get("/readyz").status_code == 200
            if witness is not None:  # the witness cosigned the continued log
                note = api.get("/log/checkpoint", role="reader").text
                assert "witness.test/w1" in note.split("\n\n", 1)[1], note


@contextmanager
def _witness(engine: str, where: Path) -> Iterator[Witness | None]:
    if engine == "postgres":  # one drill with a witness is enough
        yield None
        return
    with witness_for_log(where) as found:
        yield found


def wait_until(ready: Callable[[], bool], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, "not ready in time"
        time.sleep(0.05)


def _report_requests(journal: Path) -> list[int]:
    import json

    (folder,) = [p for p in journal.iterdir() if p.is_dir()]
    lines = [json.loads(x) for x in (folder / "erasures.jsonl").read_text().splitlines()]
    return [r for line in lines if line["type"] == "restore" for r in line["requests"]]


@contextmanager
def _database(engine: str, live: Path) -> Iterator[str]:
    if engine == "sqlite":
        yield f"sqlite:///{live / 'lethe.db'}"
    else:
        with own_database("lethe_restore") as url:
            yield url


def _backup(engine: str, live: Path, backup: Path, url: str) -> Path | None:
    if engine == "sqlite":
        sqlite_backup(live, backup)
        return None
    backup.mkdir()
    shutil.copytree(live / "blobs", backup / "blobs")
    dump = backup / "lethe.dump"
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), _libpq(url)], check=True)
    return dump


def _restore(engine: str, backup: Path, live: Path, url: str, dump: Path | None) -> None:
    if engine == "sqlite":
        sqlite_restore(backup, live)
        return
    assert dump is not None
    shutil.rmtree(live / "blobs")
    shutil.copytree(backup / "blobs", live / "blobs")
    # as an operator restores a dump: into the database made anew (this test made it)
    name = make_url(url).database
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    subprocess.run(["pg_restore", "--no-owner", "-d", _libpq(url), str(dump)], check=True)


def _libpq(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _env(settings: Settings) -> dict[str, str]:
    return {
        "LETHE_DATA_DIR": str(settings.data_dir),
        "LETHE_DATABASE_URL": settings.resolved_database_url,
        "LETHE_JOURNAL_DIR": str(settings.journal_dir),
        "LETHE_REDIS_URL": "",
    }


def test_a_restore_that_stopped_half_way_leaves_the_database_behind(tmp_path: Path) -> None:
    """`lethe restore` marks its start in the journal: a start before it finished is not
    ready, whatever the database looks like meanwhile (stubs and all)."""
    url = f"sqlite:///{tmp_path / 'lethe.db'}"
    upgrade_to_head(url)
    journal = Journal.of(tmp_path / "journal", url)
    assert verdict(database(url), journal).state == "ok"
    journal.record_restore_begun()
    found = verdict(database(url), journal)
    assert found.state == "behind" and "did not finish" in found.reason
    journal.record_restore([], [], 0)
    assert verdict(database(url), journal).state == "ok"
