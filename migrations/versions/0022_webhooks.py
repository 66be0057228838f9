"""Webhooks: `webhook_endpoints` (a receiver, its event filter and its wrapped
signing secrets) and `webhook_deliveries` (the outbox: one event for one endpoint, written in
the commit that made the event, and its delivery attempts).

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    when = app.core.db.tables.UTCDateTime(timezone=True)
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("url", sa.String(2000), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("description", sa.String(200), nullable=False, server_default=""),
        sa.Column("allow_private", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("secret_wrapped", sa.LargeBinary(), nullable=False),
        sa.Column("previous_secret_wrapped", sa.LargeBinary(), nullable=True),
        sa.Column("previous_until", when, nullable=True),
        sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("disabled_at", when, nullable=True),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column("created_at", when, nullable=False),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "endpoint_id",
            sa.Integer(),
            sa.ForeignKey(
                "webhook_endpoints.id",
                ondelete="CASCADE",
                name="fk_webhook_deliveries_endpoint_id_webhook_endpoints",
            ),
            nullable=False,
        ),
        sa.Column("message_id", sa.String(40), nullable=False),
        sa.Column("event_type", sa.String(40), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", when, nullable=False),
        sa.Column("last_attempt_at", when, nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", when, nullable=False),
        sa.Column("delivered_at", when, nullable=True),
    )
    op.create_index("ix_webhook_deliveries_endpoint_id", "webhook_deliveries", ["endpoint_id"])
    op.create_index(
        "ix_webhook_deliveries_due", "webhook_deliveries", ["status", "next_attempt_at"]
    )


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_endpoints")
