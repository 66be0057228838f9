"""Appended rows' tokens in small tables of their own until a merge moves them into the main
indexes: `sample_tokens_recent` and `subject_tokens_recent`, each with its
main table's columns and key. An append's random tokens rewrote most pages of a million-row
`sample_tokens` (~50 MB through the WAL for 10,000 rows); in a small table they touch few.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

KEYS = {
    "sample_tokens_recent": ("dataset_id", "token"),
    "subject_tokens_recent": ("dataset_id", "token", "sample_id"),
}


def upgrade() -> None:
    for table, key in KEYS.items():
        op.create_table(
            table,
            sa.Column(
                "dataset_id",
                sa.Integer(),
                sa.ForeignKey(
                    "datasets.id", ondelete="CASCADE", name=f"fk_{table}_dataset_id_datasets"
                ),
                nullable=False,
            ),
            sa.Column("token", sa.String(200), nullable=False),
            sa.Column(
                "sample_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False
            ),
            sa.PrimaryKeyConstraint(*key, name=f"pk_{table}"),
            sqlite_with_rowid=False,
        )


def downgrade() -> None:
    """The recent tokens go back into the main tables first: none is lost."""
    for table in KEYS:
        main = table.removesuffix("_recent")
        op.execute(
            f"INSERT INTO {main} (dataset_id, token, sample_id) "  # noqa: S608 (names above)
            f"SELECT dataset_id, token, sample_id FROM {table} ORDER BY dataset_id, token"
        )
        op.drop_table(table)
