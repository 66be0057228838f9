"""Samples' subject tokens in a table of their own: `subject_tokens`
(dataset, token, sample), the lookup from a client's subject to its rows, in place of the
index on `samples` (dataset_id, subject_id), whose random keys made every inserted row write
a random page (a registration with subjects took nearly twice as long as without the
index). `samples.subject_id` keeps the token; a registration writes its subject tokens last,
sorted, as it writes its id tokens (0026).

Revision ID: 0027
Revises: 0026
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "subject_tokens",
        sa.Column(
            "dataset_id",
            sa.Integer(),
            sa.ForeignKey(
                "datasets.id", ondelete="CASCADE", name="fk_subject_tokens_dataset_id_datasets"
            ),
            nullable=False,
        ),
        sa.Column("token", sa.String(200), nullable=False),
        sa.Column(
            "sample_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
        ),
        sa.PrimaryKeyConstraint("dataset_id", "token", "sample_id", name="pk_subject_tokens"),
        sqlite_with_rowid=False,
    )
    op.execute(
        "INSERT INTO subject_tokens (dataset_id, token, sample_id) "
        "SELECT dataset_id, subject_id, id FROM samples WHERE subject_id IS NOT NULL "
        "ORDER BY dataset_id, subject_id, id"
    )
    op.drop_index("ix_samples_dataset_subject", table_name="samples")


def downgrade() -> None:
    op.create_index("ix_samples_dataset_subject", "samples", ["dataset_id", "subject_id"])
    op.drop_table("subject_tokens")
