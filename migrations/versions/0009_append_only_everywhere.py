"""Append-only triggers on certificates, merkle_nodes and tree_heads, on PostgreSQL and
SQLite (only PostgreSQL's certificates had one).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

from app.core.db import append_only

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "postgresql":  # 0001's trigger, replaced by the general one
        op.execute("DROP TRIGGER IF EXISTS certificates_append_only ON certificates")
        op.execute("DROP FUNCTION IF EXISTS lethe_certificates_append_only()")
    append_only.install(bind)


def downgrade() -> None:
    append_only.drop(op.get_bind())
