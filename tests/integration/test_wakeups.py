"""Long polls are woken by the worker's commit (app/core/wakeups.py): in-process when embedded,
through a Redis channel when distributed; a wait with no wake-up ends at its timeout."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from redis import Redis

from app.core import wakeups
from app.core.wakeups import FINISHED, Announcer, Listener

REDIS = "redis://127.0.0.1:6379/0"


def test_a_wake_from_another_thread_ends_the_wait_and_clears_the_waiters() -> None:
    async def scenario() -> float:
        woken = FINISHED.register()
        threading.Timer(0.05, Announcer(None, "unused").announce).start()
        started = time.monotonic()
        await wakeups.wait(woken, 10.0)
        assert woken.done()
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 5.0  # woken, not timed out after 10 s
    assert FINISHED.waiting == 0


def test_a_wake_before_the_wait_is_not_lost() -> None:
    """Registered before the read: a commit between the read and the wait still wakes it."""

    async def scenario() -> None:
        woken = FINISHED.register()
        FINISHED.wake()  # the worker commits while the poll is reading
        await asyncio.sleep(0)
        await wakeups.wait(woken, 10.0)
        assert woken.done()

    asyncio.run(asyncio.wait_for(scenario(), 5.0))


def test_a_wait_without_a_wake_times_out_and_forgets_its_waiter() -> None:
    async def scenario() -> None:
        woken = FINISHED.register()
        await wakeups.wait(woken, 0.05)
        assert not woken.done()

    asyncio.run(scenario())
    assert FINISHED.waiting == 0


@pytest.mark.integration
def test_a_distributed_worker_wakes_the_api_through_redis() -> None:
    """A worker's announcement goes out on Redis, and another process's listener wakes its
    waiters on it (real Redis; the channel is this test's own)."""
    queue = f"lethe-test-{uuid.uuid4().hex[:8]}"
    redis = Redis.from_url(REDIS)
    watcher = redis.pubsub(ignore_subscribe_messages=True)
    watcher.subscribe(wakeups.channel(queue))
    Announcer(REDIS, queue).announce()
    message = None
    deadline = time.monotonic() + 10
    while message is None and time.monotonic() < deadline:
        message = watcher.get_message(timeout=0.5)
    watcher.close()
    assert message is not None and message["data"] == b"1"

    listener = Listener(REDIS, queue)
    listener.start()
    try:
        deadline = time.monotonic() + 10
        while redis.pubsub_numsub(wakeups.channel(queue))[0][1] < 1:  # it has subscribed
            assert time.monotonic() < deadline, "the listener never subscribed"
            time.sleep(0.02)
        time.sleep(0.2)  # past its own wake-up on subscribing

        async def scenario() -> None:
            for _ in range(3):
                woken = FINISHED.register()
                # another process publishes: nothing in this one wakes the waiter directly
                publish = threading.Timer(0.05, redis.publish, (wakeups.channel(queue), b"1"))
                publish.start()
                await wakeups.wait(woken, 10.0)
                assert woken.done()

        asyncio.run(asyncio.wait_for(scenario(), 30.0))
        # subscribed: a long poll's first look of its own comes after 250 ms, not 50
        assert FINISHED.dependable and FINISHED.first_look_seconds() == 0.25
    finally:
        listener.stop()
    assert not FINISHED.dependable and FINISHED.first_look_seconds() == 0.05


def test_a_lingering_worker_is_woken_by_the_apis_push_not_its_fallback_look() -> None:
    """The API's signal for a deletion pushes to the model's due list (with a TTL, so a push
    nobody pops goes by itself); a worker lingering on the lease blocks on that list and wakes
    as soon as the push comes, then empties it (real Redis; the queue is this test's own)."""
    from app.core.dispatch import DELETE, DUE_TTL_SECONDS, DueList, RQDispatcher, due_key
    from app.core.settings import Settings

    queue = f"lethe-test-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=REDIS, queue_name=queue)
    redis, key = Redis.from_url(REDIS), due_key(queue, 7)
    dispatcher, due = RQDispatcher(settings), DueList(REDIS, queue)
    try:
        dispatcher.enqueue(DELETE, 7)
        assert redis.llen(key) == 1 and 0 < redis.ttl(key) <= DUE_TTL_SECONDS
        assert due.wait(7, 10.0)  # already pushed: at once, and emptied
        assert redis.exists(key) == 0
        assert not due.wait(7, 0.1)  # nothing pushed: the timeout

        threading.Timer(0.2, dispatcher.enqueue, (DELETE, 7)).start()
        started = time.monotonic()
        assert due.wait(7, 10.0)
        assert 0.1 < time.monotonic() - started < 5.0  # woken by the push, not the timeout
        assert redis.exists(key) == 0
    finally:
        redis.delete(key, *redis.keys(f"lethe:{queue}:*"))
        for job in dispatcher.queue.jobs:
            job.delete()
        dispatcher.queue.delete()
