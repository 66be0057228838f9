"""Traces: `deletion_requests.trace_context`, the W3C `traceparent` of the POST
that made the request, so that the worker that applies it continues the same trace.

Revision ID: 0024
Revises: 0023
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deletion_requests") as batch:
        batch.add_column(sa.Column("trace_context", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("deletion_requests") as batch:
        batch.drop_column("trace_context")
