"""certificates: ε, δ and the cumulative spend may be NULL, for a heuristic method's
certificate (guarantee `none`), which makes no privacy claim (seed 001 §B.6).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COLUMNS = ("epsilon", "delta", "cumulative_epsilon", "cumulative_delta")


def upgrade() -> None:
    with op.batch_alter_table("certificates") as batch:
        for name in COLUMNS:
            batch.alter_column(name, nullable=True)


def downgrade() -> None:
    with op.batch_alter_table("certificates") as batch:
        for name in COLUMNS:
            batch.alter_column(name, nullable=False)
