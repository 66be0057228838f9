"""Samples' id tokens in a table of their own: `sample_tokens`
(dataset, token) → sample, the lookup from a client's id, in place of the unique index on
`samples` (dataset_id, external_id), whose random keys made every inserted row write a random
page. `samples.external_id` keeps the token; a registration writes its tokens last, sorted.

On SQLite dropping the constraint rebuilds `samples`: env.py turns foreign keys off around
the migrations, so dropping the old table cascades to nothing.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sample_tokens",
        sa.Column(
            "dataset_id",
            sa.Integer(),
            sa.ForeignKey(
                "datasets.id", ondelete="CASCADE", name="fk_sample_tokens_dataset_id_datasets"
            ),
            nullable=False,
        ),
        sa.Column("token", sa.String(200), nullable=False),
        sa.Column(
            "sample_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.PrimaryKeyConstraint("dataset_id", "token", name="pk_sample_tokens"),
        sqlite_with_rowid=False,
    )
    op.execute(
        "INSERT INTO sample_tokens (dataset_id, token, sample_id) "
        "SELECT dataset_id, external_id, id FROM samples ORDER BY dataset_id, external_id"
    )
    with op.batch_alter_table("samples") as batch:
        batch.drop_constraint("uq_samples_dataset_external", type_="unique")
    if op.get_bind().dialect.name == "sqlite":  # the rebuilt table's children still have it
        broken = op.get_bind().exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"rows left without their parents: {broken[:5]}")


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.create_unique_constraint("uq_samples_dataset_external", ["dataset_id", "external_id"])
    op.drop_table("sample_tokens")
