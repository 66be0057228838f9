"""Published checkpoints (issue 30): the log's signed C2SP checkpoints with the witness
cosignatures each gathered; `/log/checkpoint` serves the newest.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.db.tables

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column(
            "tree_size", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("cosigners", sa.Integer(), nullable=False),
        sa.Column("created_at", app.db.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tree_size", name=op.f("pk_checkpoints")),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
