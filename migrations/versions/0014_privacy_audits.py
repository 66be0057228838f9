"""Privacy audits: one row per audit of a model's certificates, with its options,
stage and aggregate result; its entry in the audit log is a certificate row.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "privacy_audits",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("requester_key_id", sa.Integer(), nullable=True),
        sa.Column("options", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=10), nullable=False),
        sa.Column("stage", sa.String(length=40), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("certificate_id", sa.Integer(), nullable=True),
        sa.Column("created_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("started_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("finished_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_privacy_audits_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_privacy_audits")),
    )
    op.create_index(
        op.f("ix_privacy_audits_model_id"), "privacy_audits", ["model_id"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_privacy_audits_model_id"), table_name="privacy_audits")
    op.drop_table("privacy_audits")
