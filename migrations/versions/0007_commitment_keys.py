"""deletion_requests.commitment_key_id: the requester's opening of the certificates'
commitment to the removed ids, kept as a data key until the request is finished; and
certificates.restricted: measured constants that are functions of the removed data, shown to
auditors only.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deletion_requests") as batch:
        batch.add_column(sa.Column("commitment_key_id", sa.Uuid(), nullable=True))
    op.add_column("certificates", sa.Column("restricted", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("certificates", "restricted")
    with op.batch_alter_table("deletion_requests") as batch:
        batch.drop_column("commitment_key_id")
