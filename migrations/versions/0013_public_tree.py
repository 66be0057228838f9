"""The public log's own tree: `public_nodes`, whose leaf i is the hash of
SHA-256(certificate i + 1's body), built here from the certificates already logged; served as
C2SP tiles under /log/. Append-only, like the certificates' tree.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from alembic import op

from app.core.db import append_only

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "public_nodes",
        sa.Column("level", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column(
            "idx",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=False,
            nullable=False,
        ),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("level", "idx", name=op.f("pk_public_nodes")),
    )
    bind = op.get_bind()
    nodes = sa.table("public_nodes", sa.column("level"), sa.column("idx"), sa.column("hash"))
    stored: dict[tuple[int, int], bytes] = {}
    rows = []
    for seq, body in bind.execute(sa.text("SELECT seq, body FROM certificates ORDER BY seq")):
        entry = hashlib.sha256(body.encode()).digest()
        value, level, idx = hashlib.sha256(b"\x00" + entry).digest(), 0, seq - 1
        stored[(level, idx)] = value
        rows.append({"level": level, "idx": idx, "hash": value.hex()})
        while idx & 1:
            value = hashlib.sha256(b"\x01" + stored[(level, idx - 1)] + value).digest()
            level, idx = level + 1, idx >> 1
            stored[(level, idx)] = value
            rows.append({"level": level, "idx": idx, "hash": value.hex()})
    if rows:
        op.bulk_insert(nodes, rows)
    append_only.install(bind, append_only.PUBLIC_TREE)


def downgrade() -> None:
    append_only.drop(op.get_bind(), append_only.PUBLIC_TREE)
    op.drop_table("public_nodes")
