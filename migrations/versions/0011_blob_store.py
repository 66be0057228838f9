"""Blobs out of the database: each blob row says where its sealed bytes are
(`location`) and in which format (`chunk_size`, null for a blob sealed whole); the database
backend keeps its objects in `blob_chunks`. Existing blobs stay readable where they are (format
1, in `blobs.data`); `lethe storage migrate` (run by `lethe serve` and `lethe migrate`) moves
them to the configured store under new data keys and destroys the old ones.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("blobs") as batch:
        batch.alter_column("data", existing_type=sa.LargeBinary(), nullable=True)
        batch.add_column(
            sa.Column("location", sa.String(length=20), nullable=False, server_default="database")
        )
        batch.add_column(sa.Column("chunk_size", sa.Integer(), nullable=True))
    op.create_table(
        "blob_chunks",
        sa.Column("key", sa.String(length=100), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", "idx", name=op.f("pk_blob_chunks")),
    )


def downgrade() -> None:
    op.drop_table("blob_chunks")
    with op.batch_alter_table("blobs") as batch:
        batch.drop_column("chunk_size")
        batch.drop_column("location")
