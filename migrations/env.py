"""Alembic environment: the URL comes from Lethe's settings unless the caller set one."""

from alembic import context

from app.core.db.session import make_engine
from app.core.db.tables import Base
from app.core.settings import get_settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().resolved_database_url


def run_migrations_offline() -> None:
    context.configure(
        url=url, target_metadata=Base.metadata, render_as_batch=True, literal_binds=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    engine = make_engine(url)
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection) -> None:  # noqa: ANN001
    sqlite = connection.dialect.name == "sqlite"
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=sqlite)
    if not sqlite:
        with context.begin_transaction():
            context.run_migrations()
        return
    # A batch migration rebuilds a table (copy, drop, rename): with foreign keys on, SQLite's
    # DROP TABLE deletes its rows first and cascades to the tables that refer to it. The
    # pragma is a no-op inside a transaction: set on the driver's connection before one.
    raw = connection.connection.driver_connection
    raw.execute("PRAGMA foreign_keys=OFF")
    try:
        with context.begin_transaction():
            context.run_migrations()
    finally:
        raw.execute("PRAGMA foreign_keys=ON")


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
