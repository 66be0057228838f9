"""datasets.rows_done and datasets.error: registration is a job: its progress is
the rows committed so far, and a registration that failed after its client was answered
keeps its error on the row (status `failed`; its rows and keys are gone).

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "datasets", sa.Column("rows_done", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("datasets", sa.Column("error", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("error")
        batch.drop_column("rows_done")
