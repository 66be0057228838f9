"""Crypto-shredding: data keys, sealed payloads, statistics and blobs, id tokens.

Existing rows are sealed in place: each sample and blob gets a data key wrapped by the master
key, raw sample and subject ids become keyed tokens (also in requests' selectors), and the
plaintext `samples.label` and `sample_statistics.norm` columns go.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from alembic import op

from app.core.settings import get_settings
from app.core.storage.crypto import SampleRecord, blob_aad, keyring, sample_aad, seal, statistic_aad

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "data_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("wrapped", sa.LargeBinary(), nullable=False),
        sa.Column("kek_id", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_data_keys")),
    )
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("key_id", sa.Uuid(), nullable=True))
    with op.batch_alter_table("blobs") as batch:
        batch.add_column(sa.Column("key_id", sa.Uuid(), nullable=True))
    _seal_existing_rows(op.get_bind())
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("label")
    with op.batch_alter_table("sample_statistics") as batch:
        batch.drop_column("norm")


def _seal_existing_rows(conn: sa.Connection) -> None:
    samples = sa.table(
        "samples",
        sa.column("id"),
        sa.column("dataset_id"),
        sa.column("external_id"),
        sa.column("subject_id"),
        sa.column("payload"),
        sa.column("label"),
        sa.column("key_id", sa.Uuid()),
    )
    if conn.execute(sa.select(sa.func.count()).select_from(samples)).scalar() == 0:
        return  # a fresh database: nothing to seal (and no master key needed yet)
    # the settings `upgrade_to_head` was given (their master key), else the environment's
    settings = (op.get_context().config.attributes or {}).get("settings") or get_settings()
    ring = keyring(settings)
    keys = sa.table(
        "data_keys", sa.column("id", sa.Uuid()), sa.column("wrapped"), sa.column("kek_id")
    )

    def new_key() -> tuple[uuid.UUID, bytes]:
        key_id = uuid.uuid4()
        raw, wrapped = ring.new_data_key()
        conn.execute(sa.insert(keys).values(id=key_id, wrapped=wrapped, kek_id=ring.kek_id))
        return key_id, raw

    sample_keys: dict[int, bytes] = {}
    for row in conn.execute(sa.select(samples)).all():
        ext = ring.token("sample", row.dataset_id, row.external_id)
        subj = ring.token("subject", row.dataset_id, row.subject_id) if row.subject_id else None
        values: dict[str, Any] = {"external_id": ext, "subject_id": subj}
        if row.payload is not None:
            key_id, raw = new_key()
            record = SampleRecord(int(row.label), row.external_id, row.subject_id, row.payload)
            values |= {"payload": seal(raw, record.encode(), sample_aad(row.dataset_id, ext))}
            values["key_id"] = key_id
            sample_keys[row.id] = raw
        conn.execute(sa.update(samples).where(samples.c.id == row.id).values(**values))

    stats = sa.table(
        "sample_statistics",
        sa.column("model_id"),
        sa.column("sample_id"),
        sa.column("kind"),
        sa.column("vector"),
    )
    for row in conn.execute(sa.select(stats)).all():
        where = sa.and_(
            stats.c.model_id == row.model_id,
            stats.c.sample_id == row.sample_id,
            stats.c.kind == row.kind,
        )
        if row.sample_id not in sample_keys:  # its sample is erased: the statistic goes too
            conn.execute(sa.delete(stats).where(where))
            continue
        sealed = seal(
            sample_keys[row.sample_id],
            row.vector,
            statistic_aad(row.model_id, row.sample_id, row.kind),
        )
        conn.execute(sa.update(stats).where(where).values(vector=sealed))

    blobs = sa.table("blobs", sa.column("key"), sa.column("data"), sa.column("key_id", sa.Uuid()))
    for row in conn.execute(sa.select(blobs.c.key, blobs.c.data)).all():
        key_id, raw = new_key()
        conn.execute(
            sa.update(blobs)
            .where(blobs.c.key == row.key)
            .values(data=seal(raw, row.data, blob_aad(row.key)), key_id=key_id)
        )

    requests = sa.table(
        "deletion_requests",
        sa.column("id"),
        sa.column("dataset_id"),
        sa.column("selector", sa.JSON),
    )
    for row in conn.execute(sa.select(requests)).all():
        selector = row.selector or {}
        tokens = {
            "sample_ids": [
                ring.token("sample", row.dataset_id, x) for x in selector.get("sample_ids", [])
            ],
            "subject_ids": [
                ring.token("subject", row.dataset_id, x) for x in selector.get("subject_ids", [])
            ],
        }
        conn.execute(sa.update(requests).where(requests.c.id == row.id).values(selector=tokens))


def downgrade() -> None:
    raise NotImplementedError("sealed data cannot be unsealed by a migration")
