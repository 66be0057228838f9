"""model_versions indexed by model where their bytes are kept (erased_at IS NULL): each commit
purges the model's older versions, and found them by scanning every version the model ever
had, a cost that grew with each deletion.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

LIVE = sa.text("erased_at IS NULL")


def upgrade() -> None:
    op.create_index(
        "ix_model_versions_live",
        "model_versions",
        ["model_id"],
        postgresql_where=LIVE,
        sqlite_where=LIVE,
    )


def downgrade() -> None:
    op.drop_index("ix_model_versions_live", table_name="model_versions")
