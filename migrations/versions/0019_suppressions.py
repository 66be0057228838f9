"""suppressions: the keyed tokens of erased subjects and samples, so that an erased person's
rows never flow back in unasked; datasets.skipped_erased counts the rows a
registration left out for that reason, datasets.ids_given says whether its sample ids are the
client's (only those go on the list; row numbers do not name anyone).

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "suppressions",
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("request_id", sa.Integer(), nullable=True),
        sa.Column("created_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=False),
        sa.Column("lifted_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=True),
        sa.Column("lift_reason", sa.Text(), nullable=True),
        sa.Column("lifted_by_key_id", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("token", name=op.f("pk_suppressions")),
    )
    # plain ADD COLUMNs (a batch would rebuild datasets, which samples reference)
    op.add_column(
        "datasets", sa.Column("skipped_erased", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "datasets", sa.Column("ids_given", sa.Boolean(), nullable=False, server_default=sa.false())
    )


def downgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("ids_given")
        batch.drop_column("skipped_erased")
    op.drop_table("suppressions")
