"""Appends: `dataset_appends` (one append of rows to a ready
dataset, a job like a registration), `samples.append_id` (the append a row came with; its
rows are `pending` until the append finishes), `datasets.test_fraction` (the split rule an
append's rows follow when they carry no split: a keyed hash of the id against it) and
`learn_tasks` (one model's learning of one append, run by the deletion pipeline).

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "datasets",
        sa.Column("test_fraction", sa.Float(), nullable=False, server_default="0.2"),
    )
    op.create_table(
        "dataset_appends",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "dataset_id",
            sa.Integer(),
            sa.ForeignKey(
                "datasets.id", ondelete="CASCADE", name="fk_dataset_appends_dataset_id_datasets"
            ),
            nullable=False,
        ),
        sa.Column("source", sa.String(40), nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("n_samples", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("rows_done", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("skipped_erased", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("created_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("progress_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("finished_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_dataset_appends_dataset_id", "dataset_appends", ["dataset_id"])
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("append_id", sa.Integer(), nullable=True))
    op.create_index("ix_samples_append", "samples", ["append_id"])
    op.create_table(
        "learn_tasks",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "append_id",
            sa.Integer(),
            sa.ForeignKey(
                "dataset_appends.id",
                ondelete="CASCADE",
                name="fk_learn_tasks_append_id_dataset_appends",
            ),
            nullable=False,
        ),
        sa.Column(
            "model_id",
            sa.Integer(),
            sa.ForeignKey("models.id", ondelete="CASCADE", name="fk_learn_tasks_model_id_models"),
            nullable=False,
        ),
        sa.Column("status", sa.String(10), nullable=False),
        sa.Column("version_id", sa.Integer(), nullable=True),
        sa.Column("certificate_id", sa.Integer(), nullable=True),
        sa.Column("n_added", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("finished_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("append_id", "model_id", name="uq_learn_tasks_pair"),
    )
    op.create_index("ix_learn_tasks_model_status", "learn_tasks", ["model_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_learn_tasks_model_status", "learn_tasks")
    op.drop_table("learn_tasks")
    op.drop_index("ix_samples_append", "samples")
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("append_id")
    op.drop_index("ix_dataset_appends_dataset_id", "dataset_appends")
    op.drop_table("dataset_appends")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("test_fraction")
