"""The embedded worker as a process of its own.

`lethe serve` without Redis spawns this process so that the worker's Python work (a retrain's
SGD loop, an update's bookkeeping) no longer takes the API's interpreter lock from the request
path. It runs the same job functions as the inline thread and as RQ. One pipe joins it to the
API process (app/core/worker_process.py): signals come in; "taken", wake-ups of the API's long
polls and this process's worker metrics go out. It dies with the API process.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import threading
from collections.abc import Callable
from functools import partial
from multiprocessing.connection import Connection

from prometheus_client import generate_latest

from app.core import tracing
from app.core.dispatch import DELETE, WARM, run_job
from app.core.lanes import Lanes
from app.core.settings import Settings
from app.core.storage.erasure import compact_at_start, finish_compacting
from app.core.wakeups import FINISHED
from app.core.webhooks.sender import SENDER_METRICS, Sender
from workers import handover, metrics
from workers.collector import Collector
from workers.context import JobContext
from workers.data import database_key
from workers.recycle import Recycle

log = logging.getLogger("lethe.embedded")

_PR_SET_PDEATHSIG = 1


class _Link:
    """This end of the pipe: sends from any thread, one at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[object, ...]) -> None:
        with self._lock:
            self.conn.send(message)

    def wake(self) -> None:
        """Relay of app/core/wakeups.FINISHED: the API process wakes its long polls."""
        with contextlib.suppress(OSError):  # the API process is gone; this one will be too
            self.send(("wake",))


class _WorkerMetrics:
    """The worker's own counters (workers/metrics.py), without the process and platform
    collectors the API process reports for itself."""

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        for metric in (
            metrics.DELETIONS_PROCESSED,
            metrics.JOB_DURATION,
            metrics.FALLBACKS,
            metrics.STORAGE_FAULTS,
            metrics.SESSIONS_WARMED,
            metrics.RESIDENT_STATES_HANDED_OVER,
            metrics.ROWS_LEARNED,
            metrics.VERSIONS_LEARNED,
            *SENDER_METRICS,  # the webhook sender runs here (app/core/webhooks/sender.py)
        ):
            yield from metric.collect()


def _die_with(parent: int) -> None:
    """Linux: the kernel kills this process when the API process dies (kill -9 included);
    a parent that died before the call is caught by the pid check."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pipe's end-of-file still stops us
        pass
    if os.getppid() != parent:
        os._exit(1)


def _listen(
    link: _Link, jobs: Lanes, stopping: threading.Event, expect: Callable[[], None]
) -> None:
    """Read the API process's messages until it says stop or goes away; "soon" (a job is
    coming: an append began) goes to `expect`."""
    exposition = _WorkerMetrics()
    while True:
        try:
            message = link.conn.recv()
        except (EOFError, OSError):  # the API process died: nothing may outlive it
            os._exit(1)
        kind = message[0]
        if kind == "job":
            jobs.put((str(message[1]), tuple(message[2])))
        elif kind == "soon":
            expect()
        elif kind == "metrics":
            link.send(("metrics", message[1], generate_latest(exposition)))
        elif kind == "stop":
            stopping.set()
            return


def main(
    settings: Settings,
    conn: Connection,
    parent: int,
    warm: tuple[int, ...] = (),
    handed: bytes | None = None,
) -> None:
    """The process's entry point: run signalled jobs one at a time until told to stop;
    first (behind any deletion) warm the sessions of `warm`, the models its predecessor held
    when it gave way after an erasure, with the method states it `handed` over
    (workers/handover.py)."""
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C: the API stops us
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())  # a service manager's stop
    tracing.configure(
        "lethe-worker", settings.trace_sql
    )  # before the engines: their statements become spans
    ctx = JobContext.build(settings)  # what every job here runs with
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s:     [worker] %(name)s: %(message)s"
    )
    link = _Link(conn)
    FINISHED.relay = link.wake
    compact_at_start(ctx.db, settings)  # keys a worker process that died had destroyed
    sender = Sender(ctx.db, ctx.runtime.keyring, settings)  # webhooks, off the API's process
    sender.start()

    def taken(item: tuple[str, tuple[int, ...]]) -> None:
        link.send(("taken", item[0], item[1]))  # a new signal for it may now be sent

    # deletions first (app/core/lanes.py): taken before queued training and audits, and run at a
    # running one's next check; every job runs here, in the main thread, as it always did
    collector = Collector()  # full collections while idle, not inside an update
    jobs = Lanes(stopping, collector.around(partial(run_job, ctx)), taken, frozenset({DELETE}))
    ctx.resident_sessions().hand_in(database_key(ctx.db.engine), handover.parsed(handed))
    del handed
    for model_id in warm:
        jobs.put((WARM, (model_id,)))
    threading.Thread(
        target=_listen,
        args=(link, jobs, stopping, collector.expect),
        name="lethe-embedded-link",
        daemon=True,
    ).start()
    # until `stopping` (SIGTERM or the API's "stop"), or until it has lived through an
    # erasure (workers/recycle.py): then a fresh process takes over, without its memory
    recycle = Recycle(ctx.db, settings.plaintext_ttl_seconds)

    def give_way(idle: float) -> bool:
        collector.idle(idle)
        return recycle.due(idle)

    gave_way = jobs.serve(give_way=give_way)
    sender.stop()
    tracing.flush()  # a multiprocessing child ends without running atexit
    ctx.runtime.publisher.finish()  # the last update's checkpoint, before the process exits
    finish_compacting(ctx.db)  # and the compaction of the keys its last erasure destroyed
    if gave_way:  # its successor warms the sessions this one held, with their method states
        held = ctx.resident_sessions().models(database_key(ctx.db.engine))
        states = handover.exported_or_none(ctx)
    ctx.db.dispose()  # its connections closed, so the API's last close removes the WAL
    if gave_way:
        with contextlib.suppress(OSError):
            link.send(("recycle", held, states))
