"""MLflow: `mlflow_exports`, one row per model version copied to MLflow: the MLflow
model version and run that hold it, and whether its artifact was deleted after Lethe purged the
version.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    when = app.core.db.tables.UTCDateTime(timezone=True)
    op.create_table(
        "mlflow_exports",
        sa.Column(
            "version_id",
            sa.Integer(),
            sa.ForeignKey(
                "model_versions.id",
                ondelete="CASCADE",
                name="fk_mlflow_exports_version_id_model_versions",
            ),
            primary_key=True,
        ),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("registered_model", sa.String(200), nullable=True),
        sa.Column("mlflow_version", sa.String(20), nullable=True),
        sa.Column("run_id", sa.String(64), nullable=True),
        sa.Column("artifact_uri", sa.String(1000), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", when, nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("seconds", sa.Float(), nullable=True),
        sa.Column("registered_at", when, nullable=True),
        sa.Column("purged_at", when, nullable=True),
    )
    op.create_index("ix_mlflow_exports_model_id", "mlflow_exports", ["model_id"])


def downgrade() -> None:
    op.drop_table("mlflow_exports")
