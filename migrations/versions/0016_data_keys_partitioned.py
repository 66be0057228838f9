"""PostgreSQL: data_keys becomes a table hash-partitioned on its id into 128 partitions, so that
compacting after an erasure rewrites only the partitions whose keys were destroyed
(`VACUUM FULL data_keys_p017`) instead of the whole table (O(n) per erasure). SQLite is unchanged (its
compaction is a WAL checkpoint; freed cells are zeroed by secure_delete).

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

PARTITIONS = 128  # app/core/storage/keystore.py names them data_keys_pNNN
COLUMNS = (
    "id UUID NOT NULL, wrapped BYTEA NOT NULL, kek_id VARCHAR(16) NOT NULL, "
    "CONSTRAINT pk_data_keys PRIMARY KEY (id)"
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE data_keys RENAME TO data_keys_unpartitioned")
    op.execute("ALTER INDEX pk_data_keys RENAME TO pk_data_keys_unpartitioned")
    op.execute(f"CREATE TABLE data_keys ({COLUMNS}) PARTITION BY HASH (id)")
    for i in range(PARTITIONS):
        op.execute(
            f"CREATE TABLE data_keys_p{i:03d} PARTITION OF data_keys "
            f"FOR VALUES WITH (MODULUS {PARTITIONS}, REMAINDER {i})"
        )
    op.execute("INSERT INTO data_keys SELECT id, wrapped, kek_id FROM data_keys_unpartitioned")
    op.execute("DROP TABLE data_keys_unpartitioned")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE data_keys RENAME TO data_keys_partitioned")
    op.execute("ALTER INDEX pk_data_keys RENAME TO pk_data_keys_partitioned")
    op.execute(f"CREATE TABLE data_keys ({COLUMNS})")
    op.execute("INSERT INTO data_keys SELECT id, wrapped, kek_id FROM data_keys_partitioned")
    op.execute("DROP TABLE data_keys_partitioned")
