"""Request fingerprints over keyed tokens, and no raw Idempotency-Key kept.

`deletion_requests.fingerprint` was sha256 of the request body with its raw ids: anyone with
the database could recover erased ids by hashing candidate bodies. It becomes sha256 of the
same body with the ids replaced by their keyed tokens, which each row already stores in
`selector` (so no master key is needed here). A stored Idempotency-Key was "<key id>:<header>"
in clear; from now on it is a keyed token, which needs the master key, so the old ones are
dropped: retrying a request sent before the upgrade with the same header creates a new
request (which finds its samples already erased, or queues them again).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import hashlib
import json

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    requests = sa.table(
        "deletion_requests",
        sa.column("id", sa.Integer),
        sa.column("dataset_id", sa.Integer),
        sa.column("selector", sa.JSON),
        sa.column("method", sa.String),
        sa.column("epsilon", sa.Float),
        sa.column("delta", sa.Float),
        sa.column("fingerprint", sa.String),
        sa.column("idempotency_key", sa.String),
    )
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(
            requests.c.id,
            requests.c.dataset_id,
            requests.c.selector,
            requests.c.method,
            requests.c.epsilon,
            requests.c.delta,
        )
    ).all()
    for row in rows:
        selector = row.selector if isinstance(row.selector, dict) else json.loads(row.selector)
        doc = {
            "dataset_id": row.dataset_id,
            "sample_ids": list(selector.get("sample_ids", [])),
            "subject_ids": list(selector.get("subject_ids", [])),
            "method": row.method,
            "epsilon": row.epsilon,
            "delta": row.delta,
        }
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
        bind.execute(
            requests.update()
            .where(requests.c.id == row.id)
            .values(fingerprint=digest, idempotency_key=None)
        )


def downgrade() -> None:
    """Nothing to restore: the raw fingerprints and keys are gone by design."""
