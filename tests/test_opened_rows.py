"""A worker reads rows in bulk (issue 55): a dense run of ids as one range, a sparse set by
`IN`, blocks copied out by column. Whichever way, the rows and arrays are the ones read
record by record (tests/factories.arrays_for, the per-row path), and an erased row refuses
to open."""

from __future__ import annotations

import pytest
import torch
from sqlalchemy import select

from app.db.session import database
from app.db.tables import Dataset, Sample
from tests.conftest import Api
from tests.factories import arrays_for, forget
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
