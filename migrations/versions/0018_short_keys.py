"""short_keys: the data keys of blobs and of requests' commitment openings move out of
data_keys into a small table of their own. Each dies with its version or its request; among
the samples' keys in data_keys' 128 partitions, a single-sample deletion's two purged blobs'
keys and its request's opening made the compaction after it rewrite up to three more
partitions. Here it rewrites the one small table.

On PostgreSQL the moved rows' bytes are then compacted out of data_keys (VACUUM FULL, outside
the migration's transaction): a blob key destroyed later must not survive there.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# the keys that are not samples': blobs' and open requests' commitment openings
SHORT_LIVED = (
    "SELECT key_id FROM blobs WHERE key_id IS NOT NULL "
    "UNION SELECT commitment_key_id FROM deletion_requests WHERE commitment_key_id IS NOT NULL"
)


def upgrade() -> None:
    op.create_table(
        "short_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("wrapped", sa.LargeBinary(), nullable=False),
        sa.Column("kek_id", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_short_keys")),
    )
    _move("data_keys", "short_keys")


def downgrade() -> None:
    _move("short_keys", "data_keys")
    op.drop_table("short_keys")


def _move(source: str, target: str) -> None:
    op.execute(
        f"INSERT INTO {target} (id, wrapped, kek_id) "
        f"SELECT id, wrapped, kek_id FROM {source} WHERE id IN ({SHORT_LIVED})"
    )
    op.execute(f"DELETE FROM {source} WHERE id IN ({SHORT_LIVED})")
    if op.get_bind().dialect.name == "postgresql" and source == "data_keys":
        with op.get_context().autocommit_block():
            op.execute("VACUUM (FULL) data_keys")
