"""Canonical ids and the deployment's identity (docs/design/canonical-ids.md,
docs/design/restore-journal.md).

- `datasets`: its rules for ids (`id_case`, `numeric_ids`) and whether its tokens are of
  canonical ids (`ids_canonical`; the datasets already here keep theirs as written).
- `suppressions.any_case`: an any-case token put there by a dataset whose ids ignore case;
  `via_subject`: a sample's, the subject whose erasure matched its row.
  The list's tokens cannot be made again of canonical ids: they are HMACs of ids Lethe never
  stored. A screen probes each row by its canonical text and by its former writing, so the
  tokens already here keep out what they kept out before.
- `models.version_floor`: the next version number after a restore, past the published ones.
- `deployment`: one row, the database's identity and its restore journal's.

Revision ID: 0029
Revises: 0028
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import app.core.db.tables

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("datasets") as batch:
        batch.add_column(
            sa.Column("id_case", sa.String(12), nullable=False, server_default="sensitive")
        )
        batch.add_column(sa.Column("numeric_ids", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(
            sa.Column("ids_canonical", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("suppressions") as batch:
        batch.add_column(
            sa.Column("any_case", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("via_subject", sa.String(64), nullable=True))
    with op.batch_alter_table("models") as batch:
        batch.add_column(
            sa.Column("version_floor", sa.Integer(), nullable=False, server_default="0")
        )
    op.create_table(
        "deployment",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("deployment_id", sa.String(36), nullable=False),
        sa.Column("journal_id", sa.String(36), nullable=True),
        sa.Column(
            "suppressions_backfilled", sa.Boolean(), nullable=False, server_default=sa.false()
        ),
        sa.Column("created_at", app.core.db.tables.UTCDateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("deployment")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("version_floor")
    with op.batch_alter_table("suppressions") as batch:
        batch.drop_column("via_subject")
        batch.drop_column("any_case")
    with op.batch_alter_table("datasets") as batch:
        batch.drop_column("ids_canonical")
        batch.drop_column("numeric_ids")
        batch.drop_column("id_case")
