"""Samples indexed by (dataset, split, status): a warm update checks that its resident test
split is unchanged by counting the active test rows, which this index answers without reading
the rows. It replaces the (dataset, split) index, a prefix of it.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_samples_dataset_split_status", "samples", ["dataset_id", "split", "status"])
    op.drop_index("ix_samples_dataset_split", table_name="samples")


def downgrade() -> None:
    op.create_index("ix_samples_dataset_split", "samples", ["dataset_id", "split"])
    op.drop_index("ix_samples_dataset_split_status", table_name="samples")
