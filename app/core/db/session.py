"""Engine and session factory; SQLite gets WAL and a busy timeout so API and worker coexist."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import sqlalchemy
from sqlalchemy import Engine, event, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

T = TypeVar("T")


# A new SQLite database's page size: a million-row registration writes 1 GB of sealed
# blocks (64 KB each) and a million rows, and 16 KB pages make fewer overflow pages per block,
# fewer WAL frames and checkpoint writes than SQLite's default 4 KB (64 KB pages were slower).
# A small commit writes larger WAL frames: a warm deletion may cost a little more.
SQLITE_PAGE_BYTES = 16384

SQLITE_BUSY_MS = 30_000  # how long a SQLite statement waits for a lock held elsewhere


def make_engine(url: str, readonly: bool = False, bookkeeping: bool = False) -> Engine:
    """Create an engine tuned for the backend behind `url`.

    On SQLite, write transactions take the write lock up front (BEGIN IMMEDIATE); a
    `readonly` engine uses deferred transactions, which in WAL mode block no writer. A
    `bookkeeping` engine's commits skip the fsync (SQLite synchronous=NORMAL, PostgreSQL
    synchronous_commit=off for the connection's whole life, so no `SET LOCAL` round trip per
    transaction): for leases and claims, which expire if lost, never for what a client was
    told is committed.
    """
    if url.startswith("sqlite"):
        engine = sqlalchemy.create_engine(
            url, connect_args={"timeout": SQLITE_BUSY_MS / 1000, "check_same_thread": False}
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, below
            cur = dbapi_conn.cursor()
            # before WAL, on a database with nothing written yet (a new one); an existing one
            # keeps its page size (until a VACUUM)
            cur.execute(f"PRAGMA page_size={SQLITE_PAGE_BYTES}")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA secure_delete=ON")  # freed cells are zeroed (erasure)
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
            cur.execute(f"PRAGMA synchronous={'NORMAL' if bookkeeping else 'FULL'}")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):
            # Take the write lock up front: a deferred transaction that later upgrades can
            # fail at once with SQLITE_BUSY_SNAPSHOT when API and worker write concurrently.
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine
    # by the module's name: tracing's instrumentation wraps it (app/core/tracing.py)
    engine = sqlalchemy.create_engine(
        url,
        pool_size=20,  # the API keeps a connection per busy request (16 clients: no reconnects)
        max_overflow=20,
        pool_use_lifo=True,  # the most recently used connection: its prepared statements
        connect_args={
            "connect_timeout": 5,  # an unreachable host is a 503, not a hang
            **({"options": "-c synchronous_commit=off"} if bookkeeping else {}),
        },
    )
    event.listen(engine, "connect", lambda dbapi_conn, _record: _SERVER_CONNECTIONS.add(dbapi_conn))
    _ping_when_idle(engine)
    return engine


PING_AFTER_IDLE_SECONDS = 1.0


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled server connection at checkout only when it sat idle for a second or more
    (SQLAlchemy's pessimistic disconnect handling, by hand): `pool_pre_ping` pinged on every
    checkout, a round trip per transaction, 13 of a deletion's ~110 statements. A
    dead connection fails its ping and the pool hands out a fresh one; one that died within
    the second fails its statement, which invalidates the pool (a 503, or a retried job)."""

    @event.listens_for(engine, "checkin")
    def _checked_in(dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or time.monotonic() - since < PING_AFTER_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_conn)
        except Exception as exc:
            raise DisconnectionError("the pooled connection failed its ping") from exc


# Connections to a database server, so a forked child can drop its copies of their sockets.
_SERVER_CONNECTIONS: weakref.WeakSet = weakref.WeakSet()


def _close_inherited_connections() -> None:
    """In a forked child (RQ forks its scheduler from the worker), close the inherited server
    sockets and forget the pools. Otherwise a parent killed mid-transaction leaves the child
    holding the socket open, and the server keeps that transaction's locks forever."""
    for conn in list(_SERVER_CONNECTIONS):
        with contextlib.suppress(Exception):
            os.close(conn.fileno())
    _SERVER_CONNECTIONS.clear()
    for db in list(_DATABASES.values()):
        db.forget_pools()


os.register_at_fork(after_in_child=_close_inherited_connections)


_DATABASES_LOCK = threading.RLock()


def engine_for(url: str, readonly: bool = False) -> Engine:
    """The process's engine for `url` (on SQLite, per read/write role): its Database's."""
    return database(url).engine_for(readonly)


def dispose_engines(url: str) -> None:
    """Close every pooled connection to `url` (all roles): the last SQLite connection to
    close checkpoints and removes the WAL."""
    database(url).dispose()


class WriteLock:
    """SQLite has one write lock per file: writers queue for it here, in order, instead of
    polling it through SQLite's busy handler, whose sleeps grow to 100 ms (they made the API's
    tail latency seconds long under load). Threads of this process queue on a
    reentrant lock; processes (the API and its embedded worker process) on an
    exclusive flock of `<database file>.lock`, which the kernel hands to the next waiter as
    soon as it is released. SQLite's own locking stays the truth: this only orders writers."""

    def __init__(self, database_file: str | None) -> None:
        self._threads = threading.RLock()
        self._depth = 0  # nested write()s of the thread holding the lock
        in_memory = not database_file or database_file == ":memory:"
        self._path = None if in_memory else f"{database_file}.lock"
        self._fd: int | None = None

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            if self._depth == 0 and self._path is not None:
                if self._fd is None:
                    self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(self._fd, fcntl.LOCK_EX)  # releases the GIL while it waits
        except BaseException:
            self._threads.release()
            raise
        self._depth += 1

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()


class Database:
    """The one way to a database: units of work, the same in the API and the workers.

    `read()` is a read-only session that never takes SQLite's write lock (deferred, WAL),
    committed and closed at the end (loaded objects stay readable, detached); `write()` is a
    transaction that commits on success and rolls back on error; `run(work)` is `write()` retried on
    transient conflicts (the one retry policy; the reconciler covers everything longer).
    `write(durable=False)` commits without waiting for the disk (SQLite synchronous=NORMAL,
    PostgreSQL synchronous_commit=off): for bookkeeping that a crash may lose harmlessly,
    leases and task claims, which expire. Commits stay ordered: a later durable commit makes
    every earlier one durable too."""

    def __init__(self, url: str) -> None:
        self.url = url
        sqlite = url.startswith("sqlite")
        self.engine = make_engine(url)
        self._read_engine = make_engine(url, readonly=True) if sqlite else self.engine
        self._bookkeeping_engine = make_engine(url, bookkeeping=True)  # its own pool
        made = {"database": self}  # every session knows its Database (`Database.of`)
        self._writer = sessionmaker(bind=self.engine, expire_on_commit=False, info=made)
        self._reader = sessionmaker(
            bind=_autocommit(self._read_engine), expire_on_commit=False, info=made
        )
        self._streamer = sessionmaker(bind=self._read_engine, expire_on_commit=False, info=made)
        self._bookkeeper = sessionmaker(
            bind=self._bookkeeping_engine, expire_on_commit=False, info=made
        )
        self._single = {
            durable: sessionmaker(bind=_autocommit(e), expire_on_commit=False, info=made)
            for durable, e in ((True, self.engine), (False, self._bookkeeping_engine))
        }
        self._write_lock = WriteLock(make_url(url).database) if sqlite else None
        self._owned: dict[type, Any] = {}
        self._owning = threading.Lock()

    @staticmethod
    def of(session: Session) -> Database:
        """The Database a session was made by (one made elsewhere: its URL's)."""
        found = session.info.get("database")
        if isinstance(found, Database):
            return found
        return database(session.get_bind().engine.url.render_as_string())

    def own(self, kind: type[T]) -> T:
        """This database's one `kind()`: what this process knows about the database and every
        session of it shares (keys destroyed and not yet compacted, the compaction under way,
        the log's frontier), held here instead of in module registries keyed by URL."""
        with self._owning:
            if kind not in self._owned:
                self._owned[kind] = kind()
            return cast(T, self._owned[kind])

    def engine_for(self, readonly: bool = False) -> Engine:
        return self._read_engine if readonly else self.engine

    def dispose(self) -> None:
        """Close every pooled connection (all roles)."""
        for engine in {self.engine, self._read_engine, self._bookkeeping_engine}:
            engine.dispose()

    def forget_pools(self) -> None:
        """In a forked child: drop the inherited pools without closing their connections."""
        for engine in {self.engine, self._read_engine, self._bookkeeping_engine}:
            engine.dispose(close=False)

    @contextmanager
    def read(self, streaming: bool = False) -> Iterator[Session]:
        """On PostgreSQL each statement of a read runs on its own (autocommit): at READ
        COMMITTED, its isolation, a transaction gave statements no common snapshot anyway,
        and its BEGIN and COMMIT were two round trips more per read. `streaming`:
        in a transaction, which PostgreSQL's server-side cursors (`yield_per`) need."""
        factory = self._streamer if streaming else self._reader
        with factory() as session:  # closing returns the connection, ending its snapshot
            yield session
            # A read ends with COMMIT, not ROLLBACK (the same for a transaction that wrote
            # nothing): psycopg forgets every prepared statement of a connection at a
            # rollback, and sent DEALLOCATE ALL once a deletion, so no statement of the worker
            # or the API ever stayed prepared. In autocommit both send nothing.
            session.commit()

    @contextmanager
    def write(self, durable: bool = True) -> Iterator[Session]:
        lock = self._write_lock or contextlib.nullcontext()
        factory = self._writer if durable else self._bookkeeper
        with lock, factory() as session, session.begin():
            yield session

    @contextmanager
    def single(self, durable: bool = True) -> Iterator[Session]:
        """`write()` for work that is one statement on PostgreSQL: there the statement
        commits on its own (autocommit), so the BEGIN and COMMIT round trips are spared
        (the claim). On SQLite it is `write()`, whatever the work sends."""
        if self._write_lock is not None:
            with self.write(durable) as session:
                yield session
            return
        with self._single[durable]() as session:
            yield session
            session.commit()  # nothing to send in autocommit but what the ORM holds

    def run(
        self, work: Callable[[Session], T], attempts: int = 5, retry_integrity: bool = False
    ) -> T:
        """Run `work` in a transaction, retrying transient conflicts with a short backoff.

        With `retry_integrity`, a unique-constraint race is retried too: an Idempotency-Key
        used twice at once (the second attempt finds the winner's row), or the audit chain's
        head moving under a commit (the next attempt appends after it).
        """

        def once() -> T:
            with self.write() as session:
                return work(session)

        def transient(exc: DBAPIError) -> bool:
            return is_retryable(exc) or (retry_integrity and isinstance(exc, IntegrityError))

        return retrying(once, attempts, transient)


def _autocommit(engine: Engine) -> Engine:
    """`engine`'s sessions in autocommit on PostgreSQL (its pool shared); SQLite's as they are."""
    if engine.dialect.name != "postgresql":
        return engine
    return engine.execution_options(isolation_level="AUTOCOMMIT")


_DATABASES: dict[str, Database] = {}


def database(url: str) -> Database:
    """The process's Database for `url`: its engines and pools, and what the process knows
    about it (`Database.own`). The one registry left: a connection pool is the
    process's, whichever runtime asks."""
    with _DATABASES_LOCK:
        if url not in _DATABASES:
            _DATABASES[url] = Database(url)
        return _DATABASES[url]


RETRYABLE_SQLSTATES = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock timeout


def retrying(
    attempt: Callable[[], T],
    attempts: int,
    transient: Callable[[DBAPIError], bool] | None = None,
) -> T:
    """`attempt()`, again after 20 ms, 40 ms, ... while it raises a transient database error
    (`is_retryable` by default); the last error is raised. The one retry loop of the code."""
    worth = transient or is_retryable
    for n in range(attempts):
        try:
            return attempt()
        except DBAPIError as exc:
            if n == attempts - 1 or not worth(exc):
                raise
            time.sleep(0.02 * 2**n)
    raise AssertionError("attempts must be at least 1")


def is_retryable(exc: BaseException) -> bool:
    """A transient conflict worth retrying: PostgreSQL deadlock/serialization, SQLite busy or
    a lock timeout."""
    if not isinstance(exc, DBAPIError):
        return False
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return state in RETRYABLE_SQLSTATES or "database is locked" in str(orig)


def rowcount(result: object) -> int:
    """Rows matched by an UPDATE or DELETE (a CursorResult's rowcount; 0 if unknown)."""
    return int(getattr(result, "rowcount", 0) or 0)
