"""Published checkpoints: the log's signed C2SP checkpoints with the witness
cosignatures each gathered; `/log/checkpoint` serves the newest. Append-only, like the tree.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables
from app.core.db import append_only

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
        sa.Column("created_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tree_size", name=op.f("pk_checkpoints")),
    )
    append_only.install(op.get_bind(), append_only.CHECKPOINTS)


def downgrade() -> None:
    append_only.drop(op.get_bind(), append_only.CHECKPOINTS)
    op.drop_table("checkpoints")
