"""merkle_nodes and tree_heads: a Merkle tree over the certificates with signed heads.

The tree of certificates that exist already is built by the first append after the upgrade
(app/transparency.py catches up before it adds leaves).

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

BIG = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "merkle_nodes",
        sa.Column("level", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("idx", BIG, primary_key=True, autoincrement=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_table(
        "tree_heads",
        sa.Column("tree_size", BIG, primary_key=True, autoincrement=False),
        sa.Column("root_hash", sa.String(64), nullable=False),
        sa.Column("timestamp", sa.String(40), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tree_heads")
    op.drop_table("merkle_nodes")
