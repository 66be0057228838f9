"""deletion_tasks.not_before: the database keeps the retry backoff (no queue-side retries).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deletion_tasks") as batch:
        batch.add_column(
            sa.Column("not_before", app.core.db.tables.UTCDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:
    with op.batch_alter_table("deletion_tasks") as batch:
        batch.drop_column("not_before")
