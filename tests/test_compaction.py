"""Compaction after an erasure on PostgreSQL rewrites only the key table's partitions in which
keys were destroyed (migration 0016), not the whole table: its cost does not grow with the
number of keys (issue 28)."""

from __future__ import annotations

import sqlalchemy as sa

from app.db.session import database
from app.storage.crypto import Keyring
from app.storage.erasure import compact
from app.storage.keystore import create_keys, destroy_keys, destroyed_in


def files(url: str) -> dict[str, int]:
    """Each partition of data_keys and the file that holds it now (a rewrite makes a new one)."""
    with database(url).read() as session:
        return dict(
            session.execute(
                sa.text(
                    "SELECT c.relname, c.relfilenode FROM pg_inherits i "
                    "JOIN pg_class c ON c.oid = i.inhrelid "
                    "WHERE i.inhparent = 'data_keys'::regclass"
                )
            ).all()
        )


def test_compaction_rewrites_only_the_partitions_that_lost_keys(pg_url: str) -> None:
    db, ring = database(pg_url), Keyring(b"k" * 32)
    with db.write() as session:
        keys = [key_id for key_id, _ in create_keys(session, ring, 200)]
    destroyed_in(db.engine.url.render_as_string())  # nothing left over from earlier tests
    before = files(pg_url)
    assert len(before) == 128

    with db.write() as session:
        holder = session.scalar(
            sa.text("SELECT tableoid::regclass::text FROM data_keys WHERE id = :k"),
            {"k": keys[0]},
        )
        assert destroy_keys(session, [keys[0]]) == 1
    compact(db)
    after = files(pg_url)
    assert {name for name in before if before[name] != after[name]} == {holder}
    with db.read() as session:
        left = session.scalar(
            sa.text("SELECT count(*) FROM data_keys WHERE id = :k"), {"k": keys[0]}
        )
    assert left == 0

    compact(db)  # nothing destroyed since: nothing is rewritten
    assert files(pg_url) == after
    compact(db, everything=True)  # a process's start: every partition
    assert all(files(pg_url)[name] != after[name] for name in after)
