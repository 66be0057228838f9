"""Rows sealed a block at a time (app/core/storage/sample_blocks.py, issue 55 goal 6): an erasure
rewrites the block under a new key, keeps every other row and its statistics readable, and
leaves the erased row's record in no block any key opens; on both databases."""

from __future__ import annotations

import threading
from uuid import UUID

import numpy as np
import pytest
import torch
from sqlalchemy import select

from app.core.db.session import database
from app.core.db.tables import DataKey, Dataset, Sample, SampleBlock
from app.core.storage import sample_blocks
from app.core.storage.crypto import SampleRecord
from app.core.storage.erasure import erase_payloads
from app.core.storage.keystore import load_keys
from app.core.storage.sample_blocks import (
    BLOCK_ROWS,
    block_records,
    open_block,
    pack,
    pack_columns,
    unpack,
)
from methods.compute import StatisticsBlock
from tests.conftest import Api
from tests.support.factories import arrays_for
from workers.statistics import read_vectors, sample_keys, write_block


def block_of(api: Api, dataset_id: int) -> tuple[UUID, list[tuple[int, int, str]]]:
    """The dataset's first block: its key and its rows (id, place, split)."""
    with database(api.url).read() as session:
        first = session.scalar(
            select(Sample.key_id).where(Sample.dataset_id == dataset_id).order_by(Sample.id)
        )
        assert first is not None
        rows = session.execute(
            select(Sample.id, Sample.block_row, Sample.split)
            .where(Sample.key_id == first)
            .order_by(Sample.block_row)
        ).all()
    return first, [(r.id, r.block_row, r.split) for r in rows]


def records_of(api: Api, key_id: UUID, dataset_id: int) -> list[bytes]:
    with database(api.url).read() as session:
        raw = load_keys(session, api.runtime.keyring, [key_id])[key_id]
        block = session.get(SampleBlock, key_id)
        assert block is not None
        return [bytes(r) for r in unpack(open_block(raw, dataset_id, key_id, block.data))]


def test_an_erasure_seals_the_block_anew_without_the_row(
    api: Api, digits: dict, ready_model: dict
) -> None:
    ring, db, dataset = api.runtime.keyring, database(api.url), digits["id"]
    old_key, rows = block_of(api, dataset)
    assert [place for _, place, _ in rows] == list(range(BLOCK_ROWS))
    # test rows: no model holds them, so they are erased at once
    gone = [sid for sid, _, split in rows if split == "test"][:2]
    kept = [sid for sid, _, _ in rows if sid not in gone]
    with db.read() as session:
        before = arrays_for(session, ring, session.get_one(Dataset, dataset), kept)
    vectors = torch.randn(len(rows), 8)
    with db.write() as session:
        ids = [sid for sid, _, _ in rows]
        block = StatisticsBlock("grad", ids, ["grad"] * len(ids), vectors)
        write_block(session, ring, ready_model["id"], block)
    records = records_of(api, old_key, dataset)

    with db.write() as session:
        assert erase_payloads(session, ring, gone) == 2

    with db.read() as session:
        assert session.get(DataKey, old_key) is None  # the old key is destroyed
        assert session.get(SampleBlock, old_key) is None
        now = {
            r.id: r
            for r in session.execute(
                select(Sample.id, Sample.key_id, Sample.block_row, Sample.status).where(
                    Sample.id.in_([sid for sid, _, _ in rows])
                )
            )
        }
        new_keys = {now[sid].key_id for sid in kept}
        assert len(new_keys) == 1 and old_key not in new_keys
        assert all(now[s].key_id is None and now[s].block_row is None for s in gone)
        assert all(now[s].status == "erased" for s in gone)
        after = arrays_for(session, ring, session.get_one(Dataset, dataset), kept)
        # the kept rows' statistics moved to the new key; the erased rows' have none
        read = read_vectors(session, ring, ready_model["id"], kept)
        assert not sample_keys(session, ring, gone)
    (new_key,) = new_keys
    assert torch.equal(after.X, before.X) and torch.equal(after.y, before.y)
    assert after.external_ids == before.external_ids
    rewritten = records_of(api, new_key, dataset)
    places = {sid: place for sid, place, _ in rows}
    for sid in gone:
        assert rewritten[places[sid]] == b"" and records[places[sid]] != b""
    for sid in kept:
        assert rewritten[places[sid]] == records[places[sid]]
    for i, (sid, _, _) in enumerate(rows):
        if sid in kept:
            assert torch.equal(read[sid], vectors[i])


def test_a_block_whose_rows_are_all_erased_is_deleted_with_its_key(api: Api) -> None:
    made = api.post("/v1/datasets", json={"builtin": "digits"})  # no model holds its rows
    assert made.status_code == 201, made.text
    key, rows = block_of(api, made.json()["id"])
    db = database(api.url)
    with db.write() as session:
        assert erase_payloads(session, api.runtime.keyring, [sid for sid, _, _ in rows]) == len(
            rows
        )
    with db.read() as session:
        assert session.get(SampleBlock, key) is None and session.get(DataKey, key) is None
        left = session.scalars(
            select(SampleBlock.key_id).where(SampleBlock.dataset_id == made.json()["id"])
        ).all()
    assert len(left) == -(-1797 // BLOCK_ROWS) - 1  # the other blocks stay


def test_rows_of_one_block_erased_at_once_by_two_transactions(api: Api) -> None:
    """Two erasures of rows of one block in concurrent transactions: on PostgreSQL the
    second waits for the first's rewrite (its blocks are locked first) and rewrites the
    block it left; both rows end erased and every other row opens."""
    made = api.post("/v1/datasets", json={"builtin": "digits"})
    dataset = made.json()["id"]
    key, rows = block_of(api, dataset)
    ring, db = api.runtime.keyring, database(api.url)
    pairs = [[rows[0][0], rows[1][0]], [rows[2][0], rows[3][0]]]
    barrier, errors = threading.Barrier(2), list[BaseException]()

    def erase(ids: list[int]) -> None:
        try:
            barrier.wait()
            db.run(lambda session: erase_payloads(session, ring, ids))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=erase, args=(p,)) for p in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    erased = {sid for p in pairs for sid in p}
    rest = [sid for sid, _, _ in rows if sid not in erased]
    with db.read() as session:
        statuses = dict(
            session.execute(select(Sample.id, Sample.status).where(Sample.id.in_(erased))).all()
        )
        keys = set(session.scalars(select(Sample.key_id).where(Sample.id.in_(rest))))
        opened = arrays_for(session, ring, session.get_one(Dataset, dataset), rest)
    assert set(statuses.values()) == {"erased"}
    assert len(keys) == 1 and key not in keys
    assert len(opened) == len(rest) and np.isfinite(opened.X.numpy()).all()
    (now,) = keys
    records = records_of(api, now, dataset)
    places = {sid: place for sid, place, _ in rows}
    assert all(records[places[s]] == b"" for s in erased)
    assert all(records[places[s]] != b"" for s in rest)


def test_a_block_that_does_not_open_does_not_hold_an_erasure_back(api: Api) -> None:
    """Erasure never depends on the block: a tampered block is deleted with its key and the
    row is erased all the same (its other rows were unreadable already)."""
    made = api.post("/v1/datasets", json={"builtin": "digits"})
    key, rows = block_of(api, made.json()["id"])
    db = database(api.url)
    with db.write() as session:
        block = session.get_one(SampleBlock, key)
        block.data = bytes(block.data[:-1]) + bytes([block.data[-1] ^ 1])
    with db.write() as session:
        assert erase_payloads(session, api.runtime.keyring, [rows[0][0]]) == 1
    with db.read() as session:
        assert session.get(SampleBlock, key) is None and session.get(DataKey, key) is None
        erased = session.get_one(Sample, rows[0][0])
    assert erased.status == "erased" and erased.key_id is None


def test_blocks_packed_by_column_and_by_record_read_alike() -> None:
    """A registration packs a block by column; blocks of earlier registrations, and every
    block sealed again after an erasure, are packed by record. Both give the same records
    (ids and subjects in UTF-8, an empty subject apart from none), and `unpack` gives each
    as `SampleRecord.encode` makes it, which an erasure's rewrite packs by record again."""
    X = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    records = [
        SampleRecord(3, "row-é", "person-1", X[0].tobytes()),
        SampleRecord(-1, "", None, X[1].tobytes()),
        SampleRecord(7, "漢字", "", X[2].tobytes()),
        SampleRecord(2**40, "r" * 300, "ß" * 70, X[3].tobytes()),
    ]
    by_column = pack_columns(
        [r.label for r in records],
        [r.external_id.encode() for r in records],
        [None if r.subject_id is None else r.subject_id.encode() for r in records],
        X.tobytes(),
    )
    by_record = pack([r.encode() for r in records])
    assert block_records(by_column) == records == block_records(by_record)
    assert unpack(by_column) == [r.encode() for r in records]
    assert [bytes(v) for v in unpack(by_record)] == [r.encode() for r in records]
    rewritten = pack([b"" if i == 1 else r for i, r in enumerate(unpack(by_column))])
    assert block_records(rewritten) == [records[0], None, records[2], records[3]]


def test_an_erasure_zeroes_every_record_it_opened_the_erased_one_included(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rewriting a block packed by column makes each row's record anew (the erased row's
    too) before packing the others by record: every one of them is zeroed with the block's
    plaintext, so the erased record is left in no freed memory of the process."""
    made = api.post("/v1/datasets", json={"builtin": "digits"})  # no model holds its rows
    assert made.status_code == 201, made.text
    dataset = made.json()["id"]
    key, rows = block_of(api, dataset)
    erased_record = records_of(api, key, dataset)[0]
    assert erased_record  # a block packed by column: its records are made anew to rewrite
    zeroed: list[bytes] = []
    wipe = sample_blocks.wipe

    def recording(data: bytes) -> None:
        zeroed.append(bytes(bytearray(data)))  # a copy: bytes(data) is data itself
        wipe(data)

    monkeypatch.setattr(sample_blocks, "wipe", recording)
    with database(api.url).write() as session:
        assert erase_payloads(session, api.runtime.keyring, [rows[0][0]]) == 1
    assert erased_record in zeroed
