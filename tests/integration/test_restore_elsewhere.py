"""The database and its restore journal know each other (app/core/ledger/deployment.py): a backup
restored into another folder, or a whole data folder put back, is not ready until `lethe
restore`, and then the log does not fork and no request, dataset, append or version number is
given twice."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from app.cli import app as cli
from app.core.settings import Settings
from tests.integration.test_restore import (
    PERSON,
    csv_rows,
    published_size,
    service,
    train,
    tree_root,
    wait_until,
)

FORM = {"id_column": "id", "subject_column": "subject", "split_column": "split"}
SMALL = b"id,label,f0\nx-1,0,1\nx-2,1,2\nx-3,0,3\n"
COPIED = ("lethe.db", "master.key", "audit-signing.key", "blobs")


def settings_of(data: Path, journal: Path | None) -> Settings:
    return Settings(
        data_dir=data, journal_dir=journal, redis_url=None, reconcile_seconds=0.5,
        bootstrap_admin_key=False,
    )  # fmt: skip


def env_of(settings: Settings) -> dict[str, str]:
    env = {
        "LETHE_DATA_DIR": str(settings.data_dir),
        "LETHE_REDIS_URL": "",
        "LETHE_DATABASE_URL": "",
    }
    return env | ({"LETHE_JOURNAL_DIR": str(settings.journal_dir)} if settings.journal_dir else {})


def copy_folder(source: Path, target: Path) -> None:
    """A stopped service's data folder, copied as a backup tool copies it."""
    target.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        if (source / name).is_dir():
            shutil.copytree(source / name, target / name)
        elif (source / name).exists():
            shutil.copy(source / name, target / name)


def history(settings: Settings) -> tuple[dict[str, str], int, int, int, str, int]:
    """A dataset and a model; a backup point (returned by the caller's copy); then what the
    backup will lack: a second dataset, an append and the person's erasure, published."""
    with service(settings) as api:
        dataset = api.post(
            "/v1/datasets", files={"file": ("d.csv", io.BytesIO(csv_rows()))}, data=FORM
        )
        assert dataset.status_code == 201, dataset.text
        model = train(api, dataset.json()["id"], {"name": "convex_head", "lam": 1e-2, "R": 8.0})
        return api.keys, dataset.json()["id"], model, 0, "", 0


def after_backup(
    settings: Settings, keys: dict[str, str], dataset: int, model: int
) -> tuple[int, dict[str, int], str, int]:
    """What the backup will lack; the lost request, the highest ids given (the append's,
    the model's version number), and the published tree's root and size."""
    with service(settings, keys) as api:
        extra = api.post("/v1/datasets", files={"file": ("e.csv", io.BytesIO(SMALL))},
                         data={"id_column": "id", "name": "lost"})  # fmt: skip
        assert extra.status_code == 201, extra.text
        more = b"id,subject,f0,f1,f2,f3,label,split\nnew-1,p-1,1,2,3,4,1,train\n"
        appended = api.post(f"/v1/datasets/{dataset}/samples", files={"file": ("m.csv", more)},
                            data=FORM)  # fmt: skip
        assert appended.status_code == 201, appended.text
        erased = api.post(
            "/v1/deletions", role="requester", json={"dataset_id": dataset, "subject_ids": [PERSON]}
        ).json()
        done = api.wait(f"/v1/deletions/{erased['id']}", ("done", "failed"))
        assert done["status"] == "done", done
        size = published_size(api)
        assert size >= 1
        versions = api.get(f"/v1/models/{model}/versions", role="admin").json()
        given = {"append": appended.json()["id"], "version": max(v["number"] for v in versions)}
        return erased["id"], given, tree_root(api, size), size


def check_shut(settings: Settings, keys: dict[str, str], lost: int) -> None:
    with service(settings, keys) as api:  # not ready, and says why
        ready = api.get("/readyz")
        assert ready.status_code == 503 and ready.json()["restore"]["state"] == "behind", ready.text
        lost_read = api.get(f"/v1/deletions/{lost}", role="admin")
        assert lost_read.status_code == 503  # not 404: it was acknowledged
        assert lost_read.json()["error"]["code"] == "restore_required"


def check_restored(settings: Settings, keys: dict[str, str], dataset: int, model: int,
                   lost: int, given: dict[str, int], root: str, size: int,
                   made: list[int]) -> None:  # fmt: skip
    with service(settings, keys) as api:
        for request_id in made:
            assert request_id > lost
            assert api.wait(f"/v1/deletions/{request_id}", ("done", "failed"))["status"] == "done"
        wait_until(lambda: api.get("/readyz").status_code == 200)
        assert tree_root(api, size) == root  # the published tree, not a fork
        small = io.BytesIO(b"id,label,f0\nn-1,0,1\nn-2,1,2\n")
        fresh = api.post("/v1/datasets", files={"file": ("f.csv", small)}, data={"id_column": "id"})
        assert fresh.status_code == 201 and fresh.json()["id"] > dataset + 1, fresh.text
        assert api.get(f"/v1/datasets/{dataset + 1}").json()["error"]["code"] == "lost_in_restore"
        versions = api.get(f"/v1/models/{model}/versions", role="admin").json()
        kept = [v["number"] for v in versions if v["number"] <= given["version"]]
        assert kept == [1]  # the backup's; the re-applied erasure's number is past the lost
        assert max(v["number"] for v in versions) > given["version"]  # ones the log published
        more = b"id,subject,f0,f1,f2,f3,label,split\nnew-2,p-2,1,2,3,4,1,train\n"
        appended = api.post(f"/v1/datasets/{dataset}/samples", files={"file": ("m.csv", more)},
                            data=FORM)  # fmt: skip
        assert appended.status_code == 201 and appended.json()["id"] > given["append"]
        again = api.post(
            "/v1/datasets", files={"file": ("d.csv", io.BytesIO(csv_rows()))}, data=FORM
        )
        assert again.status_code == 409  # the person stays erased


def restore(settings: Settings, *options: str) -> list[int]:
    """`lethe restore`; the requests it made to re-apply the lost erasures."""
    result = CliRunner().invoke(cli, ["restore", *options], env=env_of(settings))
    assert result.exit_code == 0, result.output
    return list(json.loads(result.output)["new_requests"])


def test_a_backup_restored_into_another_folder_is_not_ready_until_restored(tmp_path: Path) -> None:
    live, backup, moved, journal = (tmp_path / n for n in ("live", "backup", "moved", "journal"))
    settings = settings_of(live, journal)
    keys, dataset, model, *_ = history(settings)
    copy_folder(live, backup)
    lost, given, root, size = after_backup(settings, keys, dataset, model)
    copy_folder(backup, moved)  # the backup, started from another folder (another URL)

    elsewhere = settings_of(moved, tmp_path / "empty-journal")  # and without its journal
    with service(elsewhere, keys) as api:
        ready = api.get("/readyz").json()
        assert ready["restore"]["state"] == "behind" and "missing" in ready["restore"]["reason"]
    check_shut(settings_of(moved, journal), keys, lost)  # with its journal: behind it
    (folder,) = [p for p in journal.iterdir() if p.is_dir()]
    made = restore(elsewhere, "--journal", str(folder))
    check_restored(elsewhere, keys, dataset, model, lost, given, root, size, made)


def test_a_whole_data_folder_put_back_is_not_ready_until_restored(tmp_path: Path) -> None:
    """The journal's default place is outside the data folder: putting the whole folder back
    does not put the journal back with it."""
    live, backup = tmp_path / "live", tmp_path / "backup"
    settings = settings_of(live, None)
    assert not settings.journal_in_data_dir
    keys, dataset, model, *_ = history(settings)
    shutil.copytree(live, backup)
    lost, given, root, size = after_backup(settings, keys, dataset, model)
    shutil.rmtree(live)
    shutil.copytree(backup, live)
    check_shut(settings, keys, lost)
    check_restored(settings, keys, dataset, model, lost, given, root, size, restore(settings))


def test_a_copy_that_lives_on_alone_gets_a_journal_of_its_own(tmp_path: Path) -> None:
    live, copy, journal = tmp_path / "live", tmp_path / "copy", tmp_path / "journal"
    keys, dataset, *_ = history(settings_of(live, journal))
    copy_folder(live, copy)
    elsewhere = settings_of(copy, tmp_path / "other-journal")
    result = CliRunner().invoke(cli, ["restore", "--new-deployment"], env=env_of(elsewhere))
    assert result.exit_code == 0, result.output
    with service(elsewhere, keys) as api:
        assert api.get("/readyz").status_code == 200
    with service(settings_of(live, journal), keys) as api:  # the original is untouched
        assert api.get("/readyz").status_code == 200
