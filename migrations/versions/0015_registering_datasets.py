"""datasets.status and datasets.progress_at: a dataset is registered a chunk of samples per
commit (one transaction for a million rows held SQLite's write lock for minutes);
existing datasets are ready.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(
            sa.Column("status", sa.String(length=12), nullable=False, server_default="ready")
        )
        batch.add_column(
            sa.Column("progress_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("progress_at")
        batch.drop_column("status")
