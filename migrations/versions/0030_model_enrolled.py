"""`models.n_enrolled`: how many rows the model's training set held when it was created, so
a model with no version yet reports its size without counting `model_samples` on every read.

Revision ID: 0030
Revises: 0029
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("n_enrolled", sa.Integer(), nullable=False, server_default="0"))
    op.execute(
        "UPDATE models SET n_enrolled = (SELECT count(*) FROM model_samples"
        " WHERE model_samples.model_id = models.id)"
    )


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("n_enrolled")
