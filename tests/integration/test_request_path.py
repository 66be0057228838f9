"""The request path of issue 13: group commit, the in-process SQLite write queue, the weights
cache with conditional requests, and one pending queue signal per model."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from redis import Redis
from rq import Queue, SimpleWorker
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

import app.api.models
import app.core.ledger.publish as publication
from app.core.db.group_commit import GroupCommitter
from app.core.db.migrate import upgrade_to_head
from app.core.db.session import database
from app.core.db.tables import ApiKey
from app.core.dispatch import DELETE, RQDispatcher, deletions_queue, signal_key
from app.core.errors import APIError
from app.core.settings import Settings
from tests.conftest import Api
from tests.support.servers import RedisServer


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'gc.db'}"
    upgrade_to_head(url)
    return url


def _add_key(name: str, fail: bool = False):  # type: ignore[no-untyped-def]
    def work(session: Session) -> int:
        key = ApiKey(name=name, role="reader", key_hash=name, prefix=name[:14])
        session.add(key)
        session.flush()
        if fail:
            raise APIError(409, "conflict", "this unit fails")
        return key.id

    return work


def test_group_commit_answers_after_commit_and_isolates_failures(sqlite_url: str) -> None:
    """Every caller's row is committed (visible to another connection) when `submit` returns;
    a failing unit rolls back alone; concurrent callers share transactions."""
    db = database(sqlite_url)
    committer = GroupCommitter(db)
    groups: list[int] = []
    attempt = committer._attempt

    def counting(units):  # type: ignore[no-untyped-def]
        groups.append(len(units))
        return attempt(units)

    committer._attempt = counting  # type: ignore[method-assign]

    def one(i: int) -> int | str:
        try:
            key_id = committer.submit(_add_key(f"k{i}", fail=i % 7 == 0))
        except APIError as exc:
            return exc.code
        with db.read() as session:  # committed: another connection sees it now
            assert session.get(ApiKey, key_id) is not None
        return key_id

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(200)))
    committer.stop()
    failed = [r for r in results if r == "conflict"]
    assert len(failed) == len([i for i in range(200) if i % 7 == 0])
    with db.read() as session:
        names = set(session.scalars(select(ApiKey.name)))
    assert names == {f"k{i}" for i in range(200) if i % 7}
    assert sum(groups) >= 200 and max(groups) > 1  # grouped, not one transaction each


def test_group_commit_runs_after_in_its_writer_once_committed(sqlite_url: str) -> None:
    """`after` (the signal to a model's worker) runs in the writer thread once the unit's row
    is committed and before its caller is answered; what it raises, the caller gets, and the
    row stays committed (a 202 is not sent, the reconciler signals again)."""
    db = database(sqlite_url)
    committer = GroupCommitter(db)
    seen: list[tuple[str, bool]] = []

    def after(key_id: int) -> None:
        with db.read() as session:  # another connection sees the row already
            seen.append((threading.current_thread().name, session.get(ApiKey, key_id) is not None))

    key_id = committer.submit(_add_key("after-1"), after=after)
    assert seen == [("lethe-group-commit", True)]

    def broken(_: int) -> None:
        raise RuntimeError("redis is down")

    with pytest.raises(RuntimeError, match="redis is down"):
        committer.submit(_add_key("after-2"), after=broken)
    committer.stop()
    with db.read() as session:
        names = set(session.scalars(select(ApiKey.name)))
    assert {"after-1", "after-2"} <= names and key_id


def test_group_commit_reruns_a_unique_race_and_reports_a_database_error(
    sqlite_url: str,
) -> None:
    db = database(sqlite_url)
    committer = GroupCommitter(db)
    assert committer.submit(_add_key("same")) > 0
    tries: list[int] = []

    def duplicate(session: Session) -> int:
        tries.append(1)
        session.add(ApiKey(name="x", role="reader", key_hash="same", prefix="x"))
        session.flush()
        return 0

    with pytest.raises(Exception, match="UNIQUE"):
        committer.submit(duplicate)
    assert len(tries) == 5  # retried as a race, then reported

    def broken(session: Session) -> None:
        session.execute(text("SELECT * FROM no_such_table"))

    with pytest.raises(Exception, match="no_such_table"):
        committer.submit(broken)
    assert committer.submit(_add_key("after")) > 0  # the writer thread survives both
    committer.stop()


@pytest.mark.postgres
def test_postgres_callers_commit_in_their_own_transactions(pg_url: str, sqlite_url: str) -> None:
    """On PostgreSQL `submit` runs each unit in the caller's own transaction (concurrent
    writers beat one writer thread there); failures stay isolated and nothing is grouped."""
    db = database(pg_url)
    committer = GroupCommitter.for_database(db)
    assert not committer.grouped
    assert GroupCommitter.for_database(database(sqlite_url)).grouped
    prefix = f"pg{time.monotonic_ns()}-"

    def one(i: int) -> int | str:
        try:
            return committer.submit(_add_key(f"{prefix}{i}", fail=i % 5 == 0))
        except APIError as exc:
            return exc.code

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(40)))
    assert results.count("conflict") == 8
    with db.read() as session:
        names = set(session.scalars(select(ApiKey.name).where(ApiKey.name.like(f"{prefix}%"))))
    assert names == {f"{prefix}{i}" for i in range(40) if i % 5}
    assert committer._thread is None  # no writer thread was started


def test_sqlite_writers_of_one_process_queue_in_process(sqlite_url: str) -> None:
    """Threads never meet SQLite's busy handler: the in-process lock serialises them."""
    db = database(sqlite_url)
    inside = 0
    most = 0
    lock = threading.Lock()

    def write(i: int) -> None:
        nonlocal inside, most
        with db.write() as session:
            with lock:
                inside += 1
                most = max(most, inside)
            session.add(ApiKey(name=f"w{i}", role="reader", key_hash=f"w{i}", prefix="w"))
            session.flush()
            with lock:
                inside -= 1

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(64)))
    assert most == 1
    with db.read() as session:
        assert session.scalar(select(func.count()).select_from(ApiKey)) == 64


def test_sqlite_writers_of_two_processes_queue_on_the_lock_file(sqlite_url: str) -> None:
    """The API and its embedded worker process queue for SQLite's write lock on
    `<file>.lock` too: another process holding it holds this process's writes back."""
    db = database(sqlite_url)
    held = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from app.core.db.session import WriteLock\n"
            "with WriteLock(sys.argv[1]):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(0.6)\n",
            sqlite_url.removeprefix("sqlite:///"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert held.stdout is not None and held.stdout.readline().strip() == "held"
        start = time.monotonic()
        with db.write() as session:
            waited = time.monotonic() - start
            session.add(ApiKey(name="after", role="reader", key_hash="after", prefix="a"))
    finally:
        held.wait(10)
    assert waited > 0.3, f"the write went ahead after {waited:.3f} s"


def test_weights_are_cached_by_sha256_and_304_has_no_body(
    api: Api, ready_model: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[int] = []
    real = app.api.models.released_weights

    def counting(session, store, version):  # type: ignore[no-untyped-def]
        opened.append(version.id)
        return real(session, store, version)

    monkeypatch.setattr(app.api.models, "released_weights", counting)
    path = f"/v1/models/{ready_model['id']}/weights"
    first = api.get(path, role="reader")
    second = api.get(path, role="reader")
    assert first.status_code == second.status_code == 200
    assert first.content == second.content and len(opened) == 1  # the second from memory
    assert first.headers["cache-control"] == "no-cache"
    conditional = api.client.get(
        path, headers={**api.h("reader"), "If-None-Match": first.headers["etag"]}
    )
    assert conditional.status_code == 304 and conditional.content == b""
    assert conditional.headers["etag"] == first.headers["etag"]
    stale = api.client.get(path, headers={**api.h("reader"), "If-None-Match": '"other"'})
    assert stale.status_code == 200 and stale.content == first.content


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


def test_one_pending_signal_per_model(redis_server: RedisServer, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, redis_url=redis_server.url, queue_name="dedup")
    dispatcher = RQDispatcher(settings)
    for _ in range(50):
        dispatcher.enqueue(DELETE, 7)
    dispatcher.enqueue(DELETE, 8)
    assert dispatcher.depth() == 2  # one waiting signal per model
    redis = Redis.from_url(redis_server.url)
    assert redis.ttl(signal_key("dedup", DELETE, (7,))) > 0  # expires if its job is lost

    # A job taking its signal clears the mark: the next request signals again.
    queue = Queue(deletions_queue("dedup"), connection=redis)  # deletions' own
    queue.empty()
    queue.enqueue("app.core.dispatch.take_signal", DELETE, 7)
    worker = SimpleWorker([queue], connection=redis)
    # no command channel: its pubsub thread's join at teardown waited out a read timeout
    # now and then (a minute), past the signal's TTL
    worker.subscribe = worker.unsubscribe = lambda: None  # type: ignore[method-assign]
    worker.work(burst=True)
    assert not redis.exists(signal_key("dedup", DELETE, (7,)))
    assert redis.exists(signal_key("dedup", DELETE, (8,)))
    dispatcher.enqueue(DELETE, 7)
    dispatcher.enqueue(DELETE, 8)
    assert dispatcher.depth() == 1


def test_long_poll_answers_when_the_request_finishes(
    api: Api, digits: dict, ready_model: dict
) -> None:
    """`?wait=` returns as soon as the request is done, with its certificate."""
    sample = api.get(f"/v1/datasets/{digits['id']}/samples", params={"limit": 1}).json()
    body = {"dataset_id": digits["id"], "sample_ids": [sample["items"][0]["external_id"]]}
    created = api.post("/v1/deletions", role="requester", json=body).json()
    start = time.monotonic()
    done = api.client.get(
        f"/v1/deletions/{created['id']}", params={"wait": 30}, headers=api.h("requester")
    ).json()
    assert done["status"] == "done" and done["certificate_ids"]
    assert time.monotonic() - start < 30
    assert api.get(f"/v1/deletions/{created['id']}", params={"wait": 31}).status_code == 422


def test_opened_samples_are_cached_and_erased_ones_dropped(
    api: Api, digits: dict, ready_model: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker opens each sample once; after an erasure the next load forgets its plaintext;
    blocks are per database and dataset."""
    import workers.data as data
    from app.core.db.tables import Dataset

    opened: list[int] = []
    real = data._decode

    def counting(session, ring, rows, shape, into=None):  # type: ignore[no-untyped-def]
        opened.extend(r.id for r in rows)
        return real(session, ring, rows, shape, into)

    monkeypatch.setattr(data, "_decode", counting)
    cache = api.worker().opened  # the inline worker's own cache of opened samples
    cache.clear()  # training (the inline worker, this process) opened them already
    url = api.url
    db = database(url)
    with db.read() as session:
        dataset = session.get(Dataset, digits["id"])
        assert dataset is not None
        first = data.training_arrays(session, cache, ready_model["id"], dataset)
        again = data.training_arrays(session, cache, ready_model["id"], dataset)
    assert len(opened) == len(first) and first.sample_ids == again.sample_ids
    assert torch.equal(first.X, again.X) and torch.equal(first.y, again.y)

    sample = api.get(f"/v1/datasets/{digits['id']}/samples", params={"limit": 1}).json()
    body = {"dataset_id": digits["id"], "sample_ids": [sample["items"][0]["external_id"]]}
    created = api.post("/v1/deletions", role="requester", json=body).json()
    api.wait(f"/v1/deletions/{created['id']}", ("done",))
    with db.read() as session:
        dataset = session.get(Dataset, digits["id"])
        assert dataset is not None
        after = data.training_arrays(session, cache, ready_model["id"], dataset)
    gone = set(first.sample_ids) - set(after.sample_ids)
    assert len(gone) == 1
    cached = {s for block in cache._blocks.values() for s in block.ids.tolist()}
    assert not gone & cached  # the erased sample's plaintext is no longer held


def test_a_clean_stop_runs_the_scheduled_publication_and_joins_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Checkpoints are published at most once per interval in a timer thread; a
    clean stop publishes the head still waiting and leaves no timer holding a connection."""
    published: list[float] = []
    monkeypatch.setattr(publication, "publish", lambda db, settings: published.append(time.time()))
    settings = Settings(data_dir=tmp_path, checkpoint_interval_seconds=60.0)
    db = database(f"sqlite:///{tmp_path / 'publish.db'}")
    publisher = publication.Publisher(db, settings)

    publisher.soon()  # the first publication runs at once
    deadline = time.monotonic() + 10
    while not published and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(published) == 1
    publisher.soon()  # the next waits for the interval
    publisher.soon()  # and carries this head too
    time.sleep(0.2)
    assert len(published) == 1
    waiting = [t for t in threading.enumerate() if t.name == "lethe-publish"]
    assert waiting

    publisher.finish()
    assert len(published) == 2
    assert not any(t.is_alive() for t in waiting)
    publisher.finish()  # nothing scheduled: nothing published
    assert len(published) == 2
