"""A worker reads rows in bulk: a dense run of ids as one range, a sparse set by
`IN`, blocks copied out by column. Whichever way, the rows and arrays are the ones read
record by record (tests/support/factories.arrays_for, the per-row path), and an erased row refuses
to open."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sqlalchemy import delete, select

from app.core.db.session import database
from app.core.db.tables import DataKey, Dataset, Sample
from app.core.formats.dataset_files import ParsedDataset
from app.core.services.registration import SubjectTokens, insert_sealed, sealed_row
from app.core.storage.keystore import new_keys
from tests.conftest import Api
from tests.support.factories import arrays_for, forget
from workers import data as worker_data


def ids_of(api: Api, dataset_id: int) -> list[int]:
    with database(api.url).read() as session:
        found = session.scalars(
            select(Sample.id).where(Sample.dataset_id == dataset_id).order_by(Sample.id)
        )
        return list(found)


def test_rows_read_in_bulk_are_the_rows_read_one_by_one(api: Api) -> None:
    """A dense run (one range), every other id (a range, filtered) and two datasets' ids
    apart (`IN`)."""
    first = api.post("/v1/datasets", json={"builtin": "digits"}).json()
    second = api.post("/v1/datasets", json={"builtin": "digits"}).json()
    a, b = ids_of(api, first["id"]), ids_of(api, second["id"])
    ring = api.runtime.keyring
    for wanted in (a[:300], a[::2], a[:10] + b[-10:]):
        with database(api.url).read() as session:
            rows = worker_data._sealed_rows(session, wanted)
            assert [r.id for r in rows] == wanted
            opened = worker_data._decode(session, ring, rows, [64])
            for dataset, ids in ((first, set(a)), (second, set(b))):
                mine = [i for i in wanted if i in ids]
                if not mine:
                    continue
                truth = arrays_for(session, ring, session.get_one(Dataset, dataset["id"]), mine)
                at = [wanted.index(i) for i in mine]
                assert torch.equal(opened.X[at], truth.X.reshape(len(mine), -1))
                assert torch.equal(opened.y[at], truth.y)
                assert [opened.external_ids[i] for i in at] == truth.external_ids
                assert [opened.subjects[i] for i in at] == truth.subjects


def test_an_erased_row_refuses_to_open_and_its_block_s_others_open(api: Api, digits: dict) -> None:
    ids = ids_of(api, digits["id"])
    page = api.get(f"/v1/datasets/{digits['id']}/samples", params={"limit": 1}).json()
    forget(api, digits["id"], [page["items"][0]["external_id"]])
    ring = api.runtime.keyring
    with database(api.url).read() as session:
        rows = worker_data._sealed_rows(session, ids[:100])
        with pytest.raises(RuntimeError, match="erased but were asked for"):
            worker_data._decode(session, ring, rows, [64])
        # the others open, those of the erased row's block from its rewrite (packed by record)
        erased = session.scalars(
            select(Sample.id).where(Sample.id.in_(ids[:100]), Sample.key_id.is_(None))
        ).all()
        assert len(erased) == 1
        kept = [i for i in ids[:100] if i not in erased]
        opened = worker_data._decode(session, ring, worker_data._sealed_rows(session, kept), [64])
        truth = arrays_for(session, ring, session.get_one(Dataset, digits["id"]), kept)
        assert torch.equal(opened.X, truth.X.reshape(len(kept), -1))
        assert opened.external_ids == truth.external_ids


def test_rows_sealed_on_their_own_open_beside_block_rows(api: Api, digits: dict) -> None:
    """Rows sealed one by one under keys of their own (registrations before blocks) open in
    the same read as the block rows around them, each with its own key; a run of block rows
    and single rows alternating, and a destroyed key's row refused."""
    ring, dataset_id = api.runtime.keyring, digits["id"]
    rng = np.random.default_rng(3)
    parsed = ParsedDataset(
        X=rng.standard_normal((3, 64)).astype(np.float32),
        y=np.array([1, 2, 3]),
        ids=["alone-0", "alone-1", "alone-2"],
        subjects=[None, "someone", None],
        split=["train"] * 3,
        n_classes=10,
        kind="image",
    )
    keys = new_keys(ring, 3)
    subjects = SubjectTokens(ring, dataset_id)
    rows = [sealed_row(ring, dataset_id, parsed, i, keys[i][1], subjects) for i in range(3)]
    with database(api.url).write() as session:
        insert_sealed(session, ring, dataset_id, keys, rows)
    ids = ids_of(api, dataset_id)
    wanted = ids[:5] + ids[-3:]  # block rows, then the three sealed alone
    with database(api.url).read() as session:
        opened = worker_data._decode(session, ring, worker_data._sealed_rows(session, wanted), [64])
        truth = arrays_for(session, ring, session.get_one(Dataset, dataset_id), wanted)
    assert torch.equal(opened.X, truth.X.reshape(len(wanted), -1))
    assert torch.equal(opened.X[-3:], torch.from_numpy(parsed.X))
    assert opened.external_ids[-3:] == parsed.ids and opened.subjects[-3:] == parsed.subjects
    assert opened.y[-3:].tolist() == [1, 2, 3] and opened.sample_ids == wanted
    with database(api.url).write() as session:  # the middle one's key destroyed
        session.execute(delete(DataKey).where(DataKey.id == keys[1][0]))
    with database(api.url).read() as session:
        rows_read = worker_data._sealed_rows(session, wanted)
        with pytest.raises(RuntimeError, match=rf"samples \[{ids[-2]}\] are erased"):
            worker_data._decode(session, ring, rows_read, [64])


def test_ids_and_subjects_of_a_block_come_out_whole_ascii_or_not(api: Api) -> None:
    """A block's ids and subjects are decoded together (sliced from one string where they are
    ASCII, one by one where not), a row with no subject is None: as read record by record.
    150 rows: three blocks, one with a non-ASCII id, every fourth row with no subject."""
    lines = ["id,f1,f2,label,person"]
    for i in range(150):
        name = f"zoë-{i}" if i == 70 else f"r{i}"
        lines.append(f"{name},{i * 0.1},{-i},{i % 2},{'' if i % 4 == 0 else f'p{i % 7}'}")
    body = "\n".join(lines).encode()
    answer = api.post(
        "/v1/datasets",
        files={"file": ("people.csv", body)},
        data={"id_column": "id", "subject_column": "person"},
    )
    assert answer.status_code == 201, answer.text
    dataset_id = answer.json()["id"]
    ids = ids_of(api, dataset_id)
    ring = api.runtime.keyring
    for wanted in (ids, ids[1::3]):  # whole blocks in runs, and places apart
        with database(api.url).read() as session:
            rows = worker_data._sealed_rows(session, wanted)
            opened = worker_data._decode(session, ring, rows, [2])
            truth = arrays_for(session, ring, session.get_one(Dataset, dataset_id), wanted)
        assert opened.external_ids == truth.external_ids and opened.subjects == truth.subjects
        assert torch.equal(opened.X, truth.X.reshape(len(wanted), -1))
    with database(api.url).read() as session:
        whole = worker_data._decode(session, ring, worker_data._sealed_rows(session, ids), [2])
    assert whole.external_ids[70] == "zoë-70" and whole.subjects[:5] == [
        None,
        "p1",
        "p2",
        "p3",
        None,
    ]
