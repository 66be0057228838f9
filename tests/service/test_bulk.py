"""Bulk inserts through the driver (app/core/db/bulk.py): what they write reads back through the
ORM's own types on both backends, so registration's fast path stores what the slow one did."""

from __future__ import annotations

from uuid import UUID

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.core.db.bulk import (
    SQLITE_PARAMETERS,
    SQLITE_STATEMENT_ROWS,
    driver_uuid,
    insert_rows,
    sqlite_parameters,
)
from app.core.db.session import database
from app.core.db.tables import Base, DataKey, Dataset, Sample
from app.core.states import SampleStatus
from app.core.storage.crypto import Keyring
from app.core.storage.keystore import create_keys, load_keys


def test_keys_stored_in_bulk_load_back_on_both_backends(db_url: str) -> None:
    ring = Keyring(b"k" * 32)
    with database(db_url).write() as session:
        created = create_keys(session, ring, 3)
    with database(db_url).read() as session:
        loaded = load_keys(session, ring, [key_id for key_id, _ in created])
        kek_ids = set(session.scalars(select(DataKey.kek_id)))
    assert loaded == dict(created)
    assert all(isinstance(key_id, UUID) for key_id in loaded)
    assert kek_ids == {ring.kek_id}


COLUMNS = ("dataset_id", "external_id", "subject_id", "split", "payload", "key_id", "status")


def dataset_and_key(session: Session) -> tuple[int, UUID]:
    """A dataset's id and a stored data key's, for rows to insert."""
    ds = Dataset(name="d", kind="tabular", source="npz", feature_shape=[2], n_classes=2,
                 n_samples=0)  # fmt: skip
    session.add(ds)
    session.flush()
    ((key_id, _),) = create_keys(session, Keyring(b"k" * 32), 1)
    return ds.id, key_id


def test_sample_rows_read_back_with_their_types(db_url: str) -> None:
    with database(db_url).write() as session:
        dataset_id, key_id = dataset_and_key(session)
        conn = session.connection()
        rows = [
            (dataset_id, f"t:{i}", None, "train", b"sealed", driver_uuid(conn, key_id), "active")
            for i in range(2)
        ]
        insert_rows(conn, Base.metadata.tables["samples"], COLUMNS, rows)
    with database(db_url).read() as session:
        samples = session.scalars(select(Sample).order_by(Sample.external_id)).all()
    assert [s.external_id for s in samples] == ["t:0", "t:1"]
    assert all(s.key_id == key_id and s.status == SampleStatus.active for s in samples)
    assert all(s.payload == b"sealed" and s.subject_id is None for s in samples)


def test_an_unknown_column_is_refused_before_any_sql(db_url: str) -> None:
    with database(db_url).write() as session, pytest.raises(KeyError):
        insert_rows(session.connection(), Base.metadata.tables["samples"], ("nope",), [(1,)])


def test_more_rows_than_one_statement_takes_all_land_in_order(db_url: str) -> None:
    """On SQLite a chunk goes in as several many-row statements (SQLITE_STATEMENT_ROWS rows
    each, fewer where the library's parameter limit says so): every row lands once, in the
    order given, and the ids follow it."""
    with database(db_url).write() as session:
        dataset_id, key_id = dataset_and_key(session)
        conn = session.connection()
        limit = sqlite_parameters(conn) if conn.dialect.name == "sqlite" else SQLITE_PARAMETERS
        per = min(SQLITE_STATEMENT_ROWS, limit // len(COLUMNS))
        n = 2 * per + 3  # two full statements and a short one
        key = driver_uuid(conn, key_id)
        rows = [(dataset_id, f"t:{i:06d}", None, "train", None, key, "active") for i in range(n)]
        insert_rows(conn, Base.metadata.tables["samples"], COLUMNS, rows)
    with database(db_url).read() as session:
        names = session.scalars(select(Sample.external_id).order_by(Sample.id)).all()
    assert names == [f"t:{i:06d}" for i in range(n)]


def test_a_refused_row_is_sqlalchemys_integrity_error_and_writes_nothing(db_url: str) -> None:
    """PostgreSQL's COPY runs on the driver's cursor: its errors still come out as
    SQLAlchemy's (what the retries and the 409s look for), and the transaction keeps none of
    the rows."""
    with database(db_url).write() as session:
        dataset_id, key_id = dataset_and_key(session)
    with pytest.raises(IntegrityError), database(db_url).write() as session:
        key = driver_uuid(session.connection(), key_id)
        good = (dataset_id, "t:good", None, "train", None, key, "active")
        orphan = (dataset_id + 999, "t:orphan", None, "train", None, key, "active")  # no dataset
        insert_rows(session.connection(), Base.metadata.tables["samples"], COLUMNS, [good, orphan])
    with database(db_url).read() as session:
        assert session.scalars(select(Sample.id)).all() == []
