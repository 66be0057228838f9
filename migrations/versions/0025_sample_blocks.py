"""Samples sealed a block at a time: `sample_blocks` (a block of rows'
records sealed under one data key, which is the block's key), `samples.block_row` (a row's
place in its block) and an index of `samples.key_id` (an erasure moves a block's other rows
to its new key). Rows registered before stay sealed one by one.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sample_blocks",
        sa.Column("key_id", sa.Uuid(), primary_key=True),
        sa.Column(
            "dataset_id",
            sa.Integer(),
            sa.ForeignKey(
                "datasets.id", ondelete="CASCADE", name="fk_sample_blocks_dataset_id_datasets"
            ),
            nullable=False,
        ),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_sample_blocks_dataset_id", "sample_blocks", ["dataset_id"])
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("block_row", sa.Integer(), nullable=True))
    op.create_index("ix_samples_key", "samples", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_samples_key", table_name="samples")
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("block_row")
    op.drop_index("ix_sample_blocks_dataset_id", table_name="sample_blocks")
    op.drop_table("sample_blocks")
