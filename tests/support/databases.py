"""PostgreSQL databases that the tests and the benches make for themselves on the local
server, and alone drop: nothing here touches a database it did not create.

A migrated one is a copy of a template this process migrated once (`CREATE DATABASE ...
TEMPLATE`): migrating each from empty took 4 to 5 s (data_keys' 128 partitions). Each is
dropped on a thread of its own, waited for at exit: `DROP DATABASE` forces a checkpoint of
the whole server, which waited up to 20 s behind the other test processes' writes.
"""

from __future__ import annotations

import atexit
import os
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import sqlalchemy as sa

from app.core.db.migrate import upgrade_to_head
from app.core.db.session import engine_for

PG_ADMIN_URL = os.environ.get(
    "LETHE_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PG_BASE = PG_ADMIN_URL.rsplit("/", 1)[0]


@contextmanager
def own_database(prefix: str, migrate: bool = True) -> Iterator[str]:
    """A PostgreSQL database made here (migrated to head unless `migrate` is False), closed
    and dropped afterwards; yields its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    template = f' TEMPLATE "{_DROPPER.template()}"' if migrate else ""
    _admin(f'CREATE DATABASE "{name}"{template}')
    url = f"{PG_BASE}/{name}"
    try:
        yield url
    finally:
        engine_for(url).dispose()
        _DROPPER.drop(name)


def _admin(statement: str) -> None:
    """One statement on the server's `postgres` database, outside a transaction."""
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(statement)
    finally:
        admin.dispose()


class _Dropper:
    """This process's migrated template, made on first use, and the drops still running;
    at exit every drop is waited for, then the template dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._template: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drop-database")
        self._pending: list[Future[None]] = []
        atexit.register(self.finish)

    def template(self) -> str:
        with self._lock:
            if self._template is None:
                name = f"lethe_template_{uuid.uuid4().hex[:8]}"
                _admin(f'CREATE DATABASE "{name}"')
                url = f"{PG_BASE}/{name}"
                try:
                    upgrade_to_head(url)
                except BaseException:
                    engine_for(url).dispose()
                    _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    raise
                engine_for(url).dispose()  # a template takes no connection to be copied
                self._template = name
            return self._template

    def drop(self, name: str) -> None:
        statement = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
        self._pending.append(self._pool.submit(_admin, statement))

    def finish(self) -> None:
        pending, self._pending = self._pending, []
        for drop in pending:
            drop.result()
        with self._lock:
            template, self._template = self._template, None
        if template is not None:
            _admin(f'DROP DATABASE IF EXISTS "{template}" WITH (FORCE)')


_DROPPER = _Dropper()


def finish_drops() -> None:
    """Wait for the drops still running and drop the template (pytest's session end calls
    this: a test process may leave without running atexit)."""
    _DROPPER.finish()
