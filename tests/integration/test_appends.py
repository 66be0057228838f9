"""Appends: rows appended to a ready dataset from the same sources as a
registration, with the split their column says or the dataset's rule (a keyed hash of the id,
so a row's split never depends on when it arrives), refused when their ids are already there
(409, listed) or their person was erased (the suppression list), 422 when they are not the
dataset's kind of rows; nothing half-written in any refusal."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import DatasetAppend, Sample
from app.core.services.appends import APPEND_CHUNK, split_by_hash
from app.core.storage.crypto import keyring
from tests.conftest import Api


def table_csv(ids: range, features: int = 2, split: bool = False) -> bytes:
    head = "id,subject,label," + ",".join(f"f{j}" for j in range(features))
    rows = [head + (",split" if split else "")]
    for i in ids:
        values = ",".join(str((i * (j + 3)) % 7 * 0.5) for j in range(features))
        rows.append(
            f"row-{i:05d},person-{i // 2:04d},{i % 2},{values}"
            + ("," + ("test" if i % 3 == 0 else "train") if split else "")
        )
    return ("\n".join(rows) + "\n").encode()


FORM = {"label_column": "label", "id_column": "id", "subject_column": "subject"}


def register(api: Api, data: bytes) -> int:
    answer = api.post("/v1/datasets", files={"file": ("t.csv", data)}, data=FORM)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


def append(api: Api, dataset_id: int, data: bytes, **fields: str):
    return api.post(
        f"/v1/datasets/{dataset_id}/samples",
        files={"file": ("more.csv", data)},
        data={**FORM, **fields},
    )


def rows_of(api: Api, dataset_id: int) -> int:
    with database(api.url).read() as session:
        return int(
            session.scalar(
                select(func.count()).select_from(Sample).where(Sample.dataset_id == dataset_id)
            )
            or 0
        )


def splits(api: Api, dataset_id: int) -> dict[str, str]:
    out: dict[str, str] = {}
    offset = 0
    while True:
        page = api.get(
            f"/v1/datasets/{dataset_id}/samples", params={"offset": offset, "limit": 1000}
        ).json()
        out |= {s["external_id"]: s["split"] for s in page["items"]}
        offset += len(page["items"])
        if offset >= page["total"]:
            return out


def test_appended_rows_join_with_the_split_their_id_hashes_to(api: Api, settings) -> None:
    dataset_id = register(api, table_csv(range(20)))
    first = append(api, dataset_id, table_csv(range(1000, 1600)))
    assert first.status_code == 201, first.text
    body = first.json()
    assert (
        body["status"] == "ready" and body["n_samples"] == 600 and body["dataset_id"] == dataset_id
    )
    later = append(api, dataset_id, table_csv(range(100, 400)))  # older ids, arriving later
    assert later.status_code == 201, later.text

    view = api.get(f"/v1/datasets/{dataset_id}").json()
    assert view["n_samples"] == 920 and view["counts"]["active"] == 920
    got = splits(api, dataset_id)
    ring = keyring(settings)
    appended = [f"row-{i:05d}" for i in [*range(1000, 1600), *range(100, 400)]]
    expected = split_by_hash(ring, dataset_id, appended, 0.2)
    assert [got[x] for x in appended] == expected  # the dataset's rule, whatever the order
    share = expected.count("test") / len(expected)
    assert 0.15 < share < 0.25, share

    listed = api.get(f"/v1/datasets/{dataset_id}/appends").json()
    assert listed["total"] == 2 and [a["n_samples"] for a in listed["items"]] == [300, 600]
    one = api.get(f"/v1/datasets/{dataset_id}/appends/{body['id']}")
    assert one.status_code == 200 and one.json()["learning"] == []  # no model yet


def test_a_split_column_wins_over_the_rule(api: Api) -> None:
    dataset_id = register(api, table_csv(range(20)))
    answer = append(api, dataset_id, table_csv(range(500, 530), split=True), split_column="split")
    assert answer.status_code == 201, answer.text
    got = splits(api, dataset_id)
    for i in range(500, 530):
        assert got[f"row-{i:05d}"] == ("test" if i % 3 == 0 else "train")


def test_duplicate_ids_are_refused_with_the_list_and_nothing_is_written(api: Api) -> None:
    dataset_id = register(api, table_csv(range(20)))
    before = rows_of(api, dataset_id)
    answer = append(api, dataset_id, table_csv(range(15, 40)))
    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert error["code"] == "duplicate_ids" and error["details"]["count"] == 5
    assert error["details"]["ids"] == [f"row-{i:05d}" for i in range(15, 20)]
    assert rows_of(api, dataset_id) == before
    with database(api.url).read() as session:
        assert session.scalar(select(func.count()).select_from(DatasetAppend)) == 0


def test_an_erased_person_is_refused_in_an_append_and_skipped_on_request(api: Api) -> None:
    dataset_id = register(api, table_csv(range(20)))
    done = api.post(
        "/v1/deletions", json={"dataset_id": dataset_id, "subject_ids": ["person-0005"]}
    )
    assert done.status_code == 202, done.text
    back = table_csv(range(196, 206)).replace(b"person-0100", b"person-0005")  # new rows of them
    refused = append(api, dataset_id, back)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "erased_rows_present"
    assert refused.json()["error"]["details"]["rows"] == 2
    skipped = append(api, dataset_id, back, on_erased="skip")
    assert skipped.status_code == 201, skipped.text
    assert skipped.json()["n_samples"] == 8 and skipped.json()["skipped_erased"] == 2
    assert "row-00200" not in splits(api, dataset_id)


def test_rows_that_are_not_the_dataset_s_kind_are_a_422(api: Api) -> None:
    dataset_id = register(api, table_csv(range(20)))
    before = rows_of(api, dataset_id)
    wider = append(api, dataset_id, table_csv(range(100, 110), features=3))
    assert wider.status_code == 422 and wider.json()["error"]["code"] == "feature_shape_mismatch"
    buffer = io.BytesIO()
    np.savez(buffer, X=np.ones((5, 2), np.float32), y=np.zeros(5, np.int64))
    numbered = api.post(
        f"/v1/datasets/{dataset_id}/samples", files={"file": ("x.npz", buffer.getvalue())}
    )
    assert numbered.status_code == 422 and numbered.json()["error"]["code"] == "ids_required"
    labels = table_csv(range(100, 103)).replace(b",1,", b",7,")
    unknown = append(api, dataset_id, labels)
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "unknown_label"
    assert rows_of(api, dataset_id) == before
    missing = append(api, 999_999, table_csv(range(100, 103)))
    assert missing.status_code == 404


@pytest.mark.long
def test_an_append_whose_server_died_is_discarded_with_its_keys(tmp_path) -> None:
    """kill -9 between two of an append's chunk commits: the restarted service's reconciler
    discards it (`append_abandoned`): its rows gone, their keys destroyed and out of the
    database files; the dataset as it was; the same rows can be sent again."""
    import contextlib
    import signal
    import sqlite3
    import threading

    import httpx

    from tests.integration.test_registration import wait_file
    from tests.support.cluster import Cluster

    pause = tmp_path / "pause"
    pause.mkdir()
    data = tmp_path / "data"
    with Cluster(data, None, None, pause_dir=pause, pause_at=["append-chunk"]) as cluster:
        url = cluster.start_api()
        headers = {"Authorization": f"Bearer {cluster.admin_key}"}
        base = httpx.post(
            f"{url}/v1/datasets", files={"file": ("t.csv", table_csv(range(20)))}, data=FORM,
            headers=headers, timeout=60,
        )  # fmt: skip
        assert base.status_code == 201, base.text
        more = table_csv(range(1000, 13_000))

        def send() -> None:  # its server is killed mid-way: no answer comes
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"{url}/v1/datasets/1/samples", files={"file": ("m.csv", more)}, data=FORM,
                    headers=headers, timeout=120,
                )  # fmt: skip

        thread = threading.Thread(target=send, daemon=True)
        thread.start()
        wait_file(pause / "append-chunk-1.reached")
        db_file = data / "lethe.db"
        query = "SELECT wrapped FROM data_keys JOIN samples ON samples.key_id = data_keys.id"
        with sqlite3.connect(db_file) as conn:
            wrapped = [bytes(w) for (w,) in conn.execute(query + " WHERE append_id = 1")]
            statuses = conn.execute("SELECT DISTINCT status FROM samples WHERE append_id = 1")
            assert statuses.fetchall() == [("pending",)]  # no model or split sees them yet
        assert len(wrapped) == APPEND_CHUNK  # the first chunk's rows, of 12,000
        assert cluster.api is not None
        cluster.api.send_signal(signal.SIGKILL)
        cluster.api.wait(timeout=30)
        thread.join(timeout=30)

        cluster.env["LETHE_REGISTRATION_STALE_SECONDS"] = "1"
        cluster.env["LETHE_PAUSE_AT"] = "[]"
        cluster.start_api()
        deadline = time.monotonic() + 60
        with cluster.client() as c:
            while (seen := c.get("/v1/datasets/1/appends/1").json())["status"] != "failed":
                assert time.monotonic() < deadline, "the append was never discarded"
                time.sleep(0.2)
            assert seen["error"]["code"] == "append_abandoned"
            assert c.get("/v1/datasets/1").json()["n_samples"] == 20
        # sent again to a service with the usual staleness limit: a second of no progress
        # is what a loaded machine takes, and this append must not be discarded for it
        assert cluster.api is not None
        cluster.api.terminate()
        cluster.api.wait(timeout=30)
        del cluster.env["LETHE_REGISTRATION_STALE_SECONDS"]
        cluster.start_api()
        with cluster.client() as c:
            again = c.post("/v1/datasets/1/samples", files={"file": ("m.csv", more)}, data=FORM)
            assert again.status_code == 202, again.text  # 12,000 rows: a job
            while (seen := c.get(again.headers["Location"]).json())["status"] == "registering":
                assert time.monotonic() < deadline + 120, seen
                time.sleep(0.2)
            assert seen["status"] == "ready" and seen["n_samples"] == 12_000
        with sqlite3.connect(db_file) as conn:
            left = conn.execute("SELECT count(*) FROM samples WHERE append_id = 1").fetchone()
            assert left == (0,)
        cluster.stop()
        files = b"".join(
            p.read_bytes()
            for p in (db_file, Path(f"{db_file}-wal"), Path(f"{db_file}-shm"))
            if p.exists()
        )
        assert not [w for w in set(wrapped) if w in files]  # a block's 64 rows share a key


def test_a_person_erased_while_an_append_runs_is_taken_out_of_its_blocks(
    settings, tmp_path
) -> None:
    """A person erased after the append's first chunk was screened and written: its last
    commit takes their rows out of the block they were sealed in (the block sealed again
    under a new key without them, the old key destroyed), and the other rows of that block
    stay."""
    from app.core.db.tables import DataKey
    from tests.conftest import paused_app
    from tests.integration.test_registration import wait_file

    with paused_app(settings, tmp_path, "append-chunk") as (api, pause):
        dataset_id = register(api, table_csv(range(20)))  # people person-0000 .. person-0009
        rows = ["id,subject,label,f0,f1"]
        rows += [f"new-{i:05d},person-{i // 2:04d},{i % 2},{i * 0.5},1.0" for i in range(12_000)]
        answer = append(api, dataset_id, ("\n".join(rows) + "\n").encode())
        assert answer.status_code == 202, answer.text  # 12,000 rows: a job
        wait_file(pause / "append-chunk-1.reached")  # new-00010, new-00011 are in that chunk
        with database(api.url).read() as session:
            before = set(
                session.scalars(select(Sample.key_id).where(Sample.append_id == 1).distinct())
            )
            keys = select(DataKey.id, DataKey.wrapped).where(DataKey.id.in_(before))
            wrapped = {key_id: bytes(w) for key_id, w in session.execute(keys)}
        erased = api.post(
            "/v1/deletions", json={"dataset_id": dataset_id, "subject_ids": ["person-0005"]}
        )
        assert erased.status_code == 202 and erased.json()["status"] == "done", erased.text
        (pause / "append-chunk-1.go").touch()
        deadline = time.monotonic() + 120
        path = f"/v1/datasets/{dataset_id}/appends/1"
        while (done := api.get(path).json())["status"] == "registering":
            assert time.monotonic() < deadline, done
            time.sleep(0.05)
        assert done["status"] == "ready", done
        assert done["n_samples"] == 12_000 - 2 and done["skipped_erased"] == 2
        for person, total in (("person-0005", 0), ("person-0004", 4)):
            listed = api.get(f"/v1/datasets/{dataset_id}/samples", params={"subject": person})
            assert listed.json()["total"] == total, (person, listed.text)
        with database(api.url).read() as session:
            after = set(
                session.scalars(select(Sample.key_id).where(Sample.append_id == 1).distinct())
            )
            gone = before - after
            assert len(gone) == 1  # the one block that held the person's two rows
            assert (
                session.scalar(
                    select(func.count()).select_from(DataKey).where(DataKey.id.in_(gone))
                )
                == 0
            )
        url = settings.resolved_database_url
        if url.startswith("sqlite:///"):  # nor in the database's files (compacted)
            db_file = Path(url.removeprefix("sqlite:///"))
            files = b"".join(
                p.read_bytes()
                for p in (db_file, Path(f"{db_file}-wal"), Path(f"{db_file}-shm"))
                if p.exists()
            )
            assert not [key for key in gone if wrapped[key] in files]


def test_an_append_is_an_upload_limited_as_uploads_are(settings) -> None:
    """The ingress gate counts an append's multipart body against the upload limit, not the
    JSON one (a 10,000 × 256 float32 npz is 10 MB: it was refused at the 8 MB JSON limit)."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import make_keys

    tight = settings.model_copy(update={"max_json_bytes": 50_000})
    with TestClient(create_app(tight)) as client:
        api = Api(
            client=client,
            url=tight.resolved_database_url,
            keys=make_keys(tight.resolved_database_url),
        )
        dataset_id = register(api, table_csv(range(20)))
        big = table_csv(range(1000, 4000))
        assert 50_000 < len(big) < tight.max_upload_bytes
        answer = append(api, dataset_id, big)
        assert answer.status_code == 201, answer.text
        over = api.post("/v1/datasets", json={"builtin": "digits", "name": "x" * 60_000})
        assert over.status_code == 413  # JSON bodies keep their limit


def test_an_append_s_parse_makes_no_seeded_split() -> None:
    """With no seed (an append's parse) every row is `train` until the dataset's rule or the
    split column gives its split; a registration's parse (a seed) still splits."""
    from app.core.formats.dataset_files import seeded_split, split_of

    y = np.arange(50) % 2
    assert seeded_split(y, 0.2, None) == ["train"] * 50
    assert split_of(None, y, None, 0.2) == ["train"] * 50
    assert seeded_split(y, 0.2, 0).count("test") == 10
    assert split_of(np.array(["test"] + ["train"] * 49), y, None, 0.2)[0] == "test"
