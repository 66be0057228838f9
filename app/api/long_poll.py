"""A long poll: a view read again each time a worker's commit wakes this process
(app/core/wakeups.py), answered once it is settled or the wait is over. Deletion requests wait for
their certificates with it, appends for their models' learned versions."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import Query, Request
from starlette.concurrency import run_in_threadpool

from app.core import wakeups
from app.core.jsontypes import JsonObject

MAX_WAIT_SECONDS = 30.0


def wait_query(settled: str) -> Any:
    """The `wait` query parameter of a long poll: seconds (0 to MAX_WAIT_SECONDS) to wait
    until `settled` holds (a phrase for the docs)."""
    return Query(
        ge=0,
        le=MAX_WAIT_SECONDS,
        description=f"Long poll: answer as soon as {settled}, or after this many seconds with "
        "its state then.",
    )


async def long_poll(
    view: Callable[[], JsonObject],
    settled: Callable[[JsonObject], bool],
    request: Request,
    wait: float,
    current: JsonObject | None = None,
    woken: asyncio.Future[None] | None = None,
) -> JsonObject:
    """`view()` once `settled` holds for it or `wait` seconds have passed: a worker's commit
    wakes the wait, a look every 50–250 ms covers a lost wake-up. `current` is a view already
    read with `woken` registered before it (the caller's)."""
    deadline = time.monotonic() + wait
    pause = wakeups.FINISHED.first_look_seconds()
    while True:
        if current is None or woken is None:
            woken = wakeups.FINISHED.register()  # before the read: no wake-up falls in between
            current = await run_in_threadpool(view)
        if settled(current) or time.monotonic() >= deadline:
            wakeups.FINISHED.forget(woken)
            return current
        if await request.is_disconnected():  # nobody is waiting: stop reading the database
            wakeups.FINISHED.forget(woken)
            return current
        await wakeups.wait(woken, min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 1.5, 0.25)
        current = None
