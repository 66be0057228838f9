"""PostgreSQL databases that the tests and the benches make for themselves on the local
server, and alone drop: nothing here touches a database it did not create."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa

from app.db.migrate import upgrade_to_head
from app.db.session import engine_for

PG_ADMIN_URL = os.environ.get(
    "LETHE_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PG_BASE = PG_ADMIN_URL.rsplit("/", 1)[0]


@contextmanager
def own_database(prefix: str, migrate: bool = True) -> Iterator[str]:
    """A PostgreSQL database made here (migrated to head unless `migrate` is False), closed
    and dropped afterwards; yields its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = f"{PG_BASE}/{name}"
    try:
        if migrate:
            upgrade_to_head(url)
        yield url
    finally:
        engine_for(url).dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
