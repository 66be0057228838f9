"""Erased people stay erased: a deletion puts the keyed tokens of the
subjects and client sample ids it matched on the suppression list; a later registration
refuses their rows (409, nothing written) or leaves them out (on_erased=skip); an admin lifts
one with a reason; only tokens are stored."""

from __future__ import annotations

import io
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import func, select

from app.core.db.session import database
from app.core.db.tables import Dataset, Sample, Suppression
from app.core.services import suppression
from app.core.services.suppression import (
    HELD_MOST,
    Entry,
    Screener,
    entries,
    put_tokens,
    suppression_token,
)
from app.core.storage.crypto import Keyring
from tests.conftest import Api
from tests.integration.test_registration import wait_file


def people_csv() -> bytes:
    rows = ["id,subject,label,f0,f1"]
    rows += [f"row-{i:04d},person-{i // 2:03d},{i % 2},{i * 0.5},{(i * 7) % 3}" for i in range(10)]
    return ("\n".join(rows) + "\n").encode()


def register(api: Api, data: bytes, **fields: str):
    form = {"label_column": "label", "id_column": "id", "subject_column": "subject", **fields}
    return api.post("/v1/datasets", files={"file": ("people.csv", data)}, data=form)


def datasets(api: Api) -> int:
    with database(api.url).read() as session:
        return int(session.scalar(select(func.count()).select_from(Dataset)) or 0)


def forget(api: Api, dataset_id: int, **selector: list[str]) -> None:
    answer = api.post("/v1/deletions", json={"dataset_id": dataset_id, **selector})
    assert answer.status_code == 202 and answer.json()["status"] == "done", answer.text


def test_an_erased_person_is_refused_skipped_and_let_back_in_only_when_lifted(api: Api) -> None:
    first = register(api, people_csv())
    assert first.status_code == 201, first.text
    old = first.json()["id"]
    forget(
        api, old, subject_ids=["person-001"]
    )  # rows row-0002, row-0003 (no model holds them: erased now)
    forget(api, old, sample_ids=["row-0007"])

    before = datasets(api)
    refused = register(api, people_csv())  # next month's snapshot, the rows still in it
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "erased_rows_present"
    assert error["details"]["rows"] == 3 and error["details"]["subjects"] == 1
    assert sorted(error["details"]["sample_ids"]) == ["row-0002", "row-0003", "row-0007"]
    assert datasets(api) == before  # nothing written

    skipped = register(api, people_csv(), on_erased="skip")
    assert skipped.status_code == 201, skipped.text
    assert skipped.json()["n_samples"] == 7 and skipped.json()["skipped_erased"] == 3
    listed = api.get(f"/v1/datasets/{skipped.json()['id']}/samples").json()
    assert {s["external_id"] for s in listed["items"]}.isdisjoint(
        {"row-0002", "row-0003", "row-0007"}
    )

    assert api.get("/v1/suppressions", role="auditor").json() == {
        "subject_active": 1,
        "subject_lifted": 0,
        "sample_active": 3,  # row-0007, and row-0002 and row-0003 matched by their subject
        "sample_lifted": 0,
    }

    lifted = api.post(
        "/v1/suppressions/lift", json={"subject_id": "person-001", "reason": "re-consent"}
    )
    assert lifted.status_code == 200, lifted.text
    assert lifted.json()["kind"] == "subject" and lifted.json()["token"].startswith("t:")
    again = register(api, people_csv())
    assert again.status_code == 409 and again.json()["error"]["details"]["sample_ids"] == [
        "row-0007"
    ]
    assert (
        api.post(
            "/v1/suppressions/lift", json={"sample_id": "row-0007", "reason": "filed by mistake"}
        ).status_code
        == 200
    )
    back = register(api, people_csv())
    assert back.status_code == 201 and back.json()["n_samples"] == 10

    with database(api.url).read() as session:
        rows = session.scalars(select(Suppression)).all()
    assert {r.kind for r in rows} == {"subject", "sample", "subject_folded", "sample_folded"}
    assert all(r.lifted_at is not None and r.lift_reason for r in rows)
    stored = " ".join(f"{r.token} {r.kind}" for r in rows)
    assert "person-001" not in stored and "row-0007" not in stored  # tokens only
    forget(api, back.json()["id"], subject_ids=["person-001"])  # erased again: suppressed again
    assert register(api, people_csv()).status_code == 409


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # not a dialect's behaviour
def test_lifting_is_checked_and_admin_only(api: Api) -> None:
    assert (
        api.post(
            "/v1/suppressions/lift", json={"subject_id": "nobody", "reason": "why"}
        ).status_code
        == 404
    )
    assert api.post("/v1/suppressions/lift", json={"reason": "why"}).status_code == 422
    both = {"subject_id": "a", "sample_id": "b", "reason": "why"}
    assert api.post("/v1/suppressions/lift", json=both).status_code == 422
    assert (
        api.post("/v1/suppressions/lift", json={"subject_id": "a", "reason": ""}).status_code == 422
    )
    reader = api.post(
        "/v1/suppressions/lift", role="auditor", json={"subject_id": "a", "reason": "x" * 5}
    )
    assert reader.status_code == 403
    assert api.get("/v1/suppressions", role="requester").status_code == 403
    assert register(api, people_csv(), on_erased="maybe").status_code == 422


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # not a dialect's behaviour
def test_row_numbers_are_no_one_s_ids(api: Api) -> None:
    """An upload without an id column numbers its rows; erasing row "3" of one such dataset
    does not keep row 3 of every later one out."""
    buf = io.BytesIO()
    np.savez(buf, X=np.arange(40, dtype=np.float32).reshape(10, 4), y=np.arange(10) % 2)
    first = api.post("/v1/datasets", files={"file": ("d.npz", buf.getvalue())})
    assert first.status_code == 201
    forget(api, first.json()["id"], sample_ids=["3"])
    second = api.post("/v1/datasets", files={"file": ("d.npz", buf.getvalue())})
    assert second.status_code == 201 and second.json()["n_samples"] == 10


def many_people_csv(n: int = 12_000) -> bytes:
    """More rows than a chunk (registration.CHUNK) and than an inline registration: a job."""
    rows = ["id,subject,label,f0"]
    rows += [f"row-{i:05d},person-{i // 2:05d},{i % 2},{i * 0.5}" for i in range(n)]
    return ("\n".join(rows) + "\n").encode()


def test_a_person_erased_while_a_registration_runs_does_not_come_back_through_it(
    paused_api: tuple[Api, Path],
) -> None:
    """Screening is per chunk, as each is sealed: a person erased after their rows' chunk was
    screened and written is found in the registration's last commit (its rows refused, or
    taken out of their blocks and deleted with `skip`)."""
    api, pause = paused_api
    (pause / "registration-chunk-1.go").touch()  # the first dataset registers straight through
    first = register(api, many_people_csv())
    assert first.status_code == 202, first.text
    assert api.wait("/v1/datasets/1", ("ready", "failed"))["status"] == "ready"
    assert api.get("/v1/datasets/1").json()["n_samples"] == 12_000

    for dataset_id, on_erased, person in ((2, "refuse", "person-00010"),
                                          (3, "skip", "person-00011")):  # fmt: skip
        answer = register(api, many_people_csv(), on_erased=on_erased)
        assert answer.status_code == 202 and answer.json()["id"] == dataset_id, answer.text
        wait_file(pause / f"registration-chunk-{dataset_id}.reached")  # its first chunk written
        forget(api, 1, subject_ids=[person])  # rows 20..23 are in that first chunk
        (pause / f"registration-chunk-{dataset_id}.go").touch()
        done = api.wait(f"/v1/datasets/{dataset_id}", ("ready", "failed"))
        if on_erased == "refuse":
            assert done["status"] == "failed", done
            assert done["error"]["code"] == "erased_rows_present"
            assert sorted(done["error"]["details"]["sample_ids"]) == ["row-00020", "row-00021"]
            assert done["error"]["details"]["subjects"] == 1
            with database(api.url).read() as session:
                left = session.scalar(
                    select(func.count()).select_from(Sample).where(Sample.dataset_id == 2)
                )
            assert left == 0  # discarded with its keys
        else:  # person-00010 left out when screened, person-00011 in the last commit
            assert done["status"] == "ready", done
            assert done["n_samples"] == 12_000 - 4 and done["skipped_erased"] == 4
            counts = done["counts"]
            assert counts["train"] + counts["test"] == 12_000 - 4 and counts.get("erased", 0) == 0
            listed = api.get(f"/v1/datasets/{dataset_id}/samples", params={"limit": 1}).json()
            assert listed["total"] == 12_000 - 4
            for gone in ("person-00010", "person-00011"):
                rows = api.get(f"/v1/datasets/{dataset_id}/samples", params={"subject": gone})
                assert rows.json()["total"] == 0, rows.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # Screener's own logic
@pytest.mark.parametrize("held_most", [HELD_MOST, 0], ids=["list_held", "list_looked_up"])
def test_the_screener_finds_a_person_in_every_chunk_and_late_finds_only_new_entries(
    db_url: str, held_most: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subject found on the list in one chunk is refused in the next chunks too (it is
    looked up once); `late` finds the rows of entries made after the chunk was screened, and
    nothing for entries it had screened already. The same with the list held in memory (a
    short one) and looked up a chunk at a time (longer than HELD_MOST)."""
    monkeypatch.setattr(suppression, "HELD_MOST", held_most)
    ring = Keyring(b"m" * 32)
    ids = [f"row-{i}" for i in range(8)]
    subjects: list[str | None] = ["a", "a", "b", None, "a", "c", "b", "d"]
    db = database(db_url)
    with db.write() as session:
        put_tokens(session, entries(ring, "subject", ["a"]), None)
        put_tokens(session, entries(ring, "sample", ["row-5"]), None)
    screener = Screener(ring, ids, subjects, samples=True)
    with db.read() as session:
        assert screener.chunk(session, 0, 3) == [0, 1]
        assert screener.chunk(session, 3, 5) == [4]  # "a" again, not looked up again
        assert screener.chunk(session, 5, 8) == [5]  # row-5 by its id
        since = session.scalar(select(func.max(Suppression.created_at)))
    assert since is not None
    with db.write() as session:  # put on the list after the screen: "b", and row-7 by its id
        put_tokens(session, entries(ring, "subject", ["b"]), None)
        put_tokens(session, entries(ring, "sample", ["row-7"]), None)
    with db.read() as session:
        late = screener.late(session, since)
        assert late.rows == [2, 6, 7] and late.subjects == 1  # rows 0, 1, 4, 5 were refused
        assert late.sample_ids == ["row-2", "row-6", "row-7"]
        assert screener.late(session, since + timedelta(days=1)).rows == []


def test_a_person_erased_again_after_a_lift_is_found_by_the_late_check(db_url: str) -> None:
    """A lifted suppression put back (the person erased again) is on the list from then: an
    upload that screened the person while lifted finds their rows in its late check."""
    from app.core.db.tables import utcnow
    from app.core.services.suppression import lift_token

    ring = Keyring(b"r" * 32)
    token = suppression_token(ring, "subject", "again")
    db = database(db_url)
    with db.write() as session:
        put_tokens(session, [Entry("subject", token)], None)
    with db.write() as session:
        assert lift_token(session, token, "re-consent", None) is not None
    screener = Screener(ring, ["r-0", "r-1", "r-2"], ["again", None, "again"], samples=True)
    with db.read() as session:
        assert screener.chunk(session, 0, 3) == []  # lifted: the rows are clean
    since = utcnow()
    with db.write() as session:
        put_tokens(session, [Entry("subject", token)], None)  # erased again while the upload runs
    with db.read() as session:
        row = session.execute(select(Suppression).where(Suppression.token == token)).scalar_one()
        assert row.lifted_at is None and row.created_at >= since
        assert screener.late(session, since).rows == [0, 2]


def test_an_append_s_late_check_names_the_rows_it_kept(db_url: str) -> None:
    """An append that left an erased person's rows out (`on_erased=skip`) still finds, in its
    last commit, the rows of a person erased meanwhile, numbered among the rows it kept."""
    from types import SimpleNamespace
    from typing import Any, cast

    from app.core.db.tables import utcnow
    from app.core.formats.dataset_files import finish
    from app.core.services.registration import screened

    ring = Keyring(b"k" * 32)
    db = database(db_url)
    with db.write() as session:
        put_tokens(session, entries(ring, "subject", ["gone"]), None)
    subjects: list[str | None] = ["gone", "stay", "gone", "late", "stay", "late"]
    ids = [f"k-{i}" for i in range(6)]
    X = np.arange(12, dtype=np.float32).reshape(6, 2)
    parsed = finish(X, np.arange(6) % 2, ids, subjects, ["train"] * 6, "tabular")
    runtime = cast(Any, SimpleNamespace(keyring=ring, db=db))
    screening = screened(runtime, parsed, True, "skip")
    assert screening.skipped == 2 and screening.parsed.ids == ["k-1", "k-3", "k-4", "k-5"]
    since = utcnow()
    with db.write() as session:  # erased while the append runs
        put_tokens(session, entries(ring, "subject", ["late"]), None)
    with db.read() as session:
        late = screening.late(session, since)
    assert [screening.parsed.ids[i] for i in late] == ["k-3", "k-5"]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_lift_schema_says_exactly_one_id(api: Api) -> None:
    """What the validator refuses (both ids, or neither) the OpenAPI document refuses too, so a
    client generated from it never sends it."""
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    lift = schemas["LiftIn"]
    assert lift["oneOf"] == [{"required": ["subject_id"]}, {"required": ["sample_id"]}]
    assert lift["properties"]["subject_id"]["type"] == "string"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_rows_accepted_for_erasure_before_are_listed_once(api: Api) -> None:
    """An erasure accepted before subject erasures listed sample ids (its rows `erasing`,
    their records still open): the backfill lists them, once per database."""
    from sqlalchemy import update

    from app.core.db.tables import Deployment
    from app.core.services.deletions import backfill_suppressions
    from app.core.states import SampleStatus

    first = register(api, people_csv())
    assert first.status_code == 201, first.text
    db = database(api.url)
    with db.write() as session:  # as an older version left them: accepted, not yet erased
        session.execute(
            update(Sample).where(Sample.id.in_([3, 4])).values(status=SampleStatus.erasing)
        )
        session.execute(update(Deployment).values(suppressions_backfilled=False))
    ring = api.runtime.keyring
    assert backfill_suppressions(db, ring) == 2
    assert backfill_suppressions(db, ring) == 0  # done: the table is not read again
    assert api.get("/v1/suppressions", role="auditor").json()["sample_active"] == 2
    refused = register(api, people_csv())
    assert refused.status_code == 409
    assert sorted(refused.json()["error"]["details"]["sample_ids"]) == ["row-0002", "row-0003"]
