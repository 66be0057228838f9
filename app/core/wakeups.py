"""Waking long polls when a worker finishes requests, instead of polling the database on a
growing timer (a certificate committed just after a poll was seen a whole step late).

The database stays the record: a wake-up only says "look again", so a lost one costs a
fallback poll, never a wrong answer. Embedded, the worker wakes the API's waiters directly
(a thread) or over its pipe (a process); distributed, a worker publishes on a Redis channel
and each API process's listener thread wakes its own waiters.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("lethe.wakeups")


def channel(queue_name: str) -> str:
    """The Redis channel on which workers of this queue announce finished requests."""
    return f"lethe:{queue_name}:finished"


class Wakeups:
    """Waiters registered before they read, woken by `wake` from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        # wake-ups reach this process now (an embedded worker, or a subscribed listener): a
        # waiter may then look at the database itself less often (`first_look_seconds`)
        self.dependable = False
        # the embedded worker process passes its wake-ups on to the API process
        # (workers/embedded.py); None elsewhere
        self.relay: Callable[[], None] | None = None

    def first_look_seconds(self) -> float:
        """How long a waiter waits before its first look of its own: 250 ms while wake-ups
        are dependable, else 50 ms. A 50 ms look fired just before the wake-up of a
        deletion that takes about that long: one more read on the request's path."""
        return 0.25 if self.dependable else 0.05

    def register(self) -> asyncio.Future[None]:
        """A future that `wake` resolves; register before reading, so no wake-up falls
        between the read and the wait."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            self._waiters.add((loop, future))
        return future

    def forget(self, future: asyncio.Future[None]) -> None:
        with self._lock:
            self._waiters = {w for w in self._waiters if w[1] is not future}

    def wake(self) -> None:
        """Resolve every registered future (thread-safe; cheap when nobody waits), and
        pass the wake-up on where a relay is set."""
        if self.relay is not None:
            self.relay()
        with self._lock:
            waiters, self._waiters = self._waiters, set()
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop is closed: nobody is waiting on it
                continue

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiters)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


FINISHED = Wakeups()


async def wait(future: asyncio.Future[None], timeout: float) -> None:
    """Until the future is woken or `timeout` seconds pass, whichever is first."""
    await asyncio.wait({future}, timeout=timeout)
    if not future.done():
        FINISHED.forget(future)


class Announcer:
    """A worker's side: after a commit that finished requests, wake the waiters — in this
    process (embedded) or through Redis (distributed). Never raises: the poll is the fallback."""

    def __init__(self, redis_url: str | None, queue_name: str) -> None:
        self.channel = channel(queue_name)
        self._redis: Any = None
        if redis_url:
            from redis import Redis

            self._redis = Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)

    def announce(self) -> None:
        FINISHED.wake()
        if self._redis is not None:
            try:
                self._redis.publish(self.channel, b"1")
            except Exception:  # Redis away: long polls find the result on their next look
                log.debug("could not announce on %s", self.channel, exc_info=True)


class Listener:
    """An API process's side in distributed mode: a daemon thread subscribed to the channel
    that wakes this process's waiters on each message, reconnecting after Redis outages."""

    def __init__(self, redis_url: str, queue_name: str) -> None:
        self.redis_url, self.channel = redis_url, channel(queue_name)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lethe-wakeups", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        from redis import Redis

        while not self._stop.is_set():
            try:
                client = Redis.from_url(self.redis_url, socket_connect_timeout=2)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                FINISHED.dependable = True
                FINISHED.wake()  # anything finished while we were not listening
                while not self._stop.is_set():
                    if pubsub.get_message(timeout=0.5) is not None:
                        FINISHED.wake()
                FINISHED.dependable = False
                pubsub.close()
                client.close()
            except Exception:  # Redis down: polls go on; try again shortly
                FINISHED.dependable = False
                log.debug("wake-up listener lost Redis; retrying", exc_info=True)
                self._stop.wait(1.0)
