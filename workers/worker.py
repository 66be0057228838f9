"""`lethe worker`: an RQ SimpleWorker (no fork, so CUDA works), the maintenance tasks
(app/core/maintenance.py: reconcile, publish, sweep) and the
worker's Prometheus metrics on LETHE_WORKER_METRICS_PORT. Imports no web framework.

Redis may go away at any moment (it carries only signals; the database is the record). RQ's
own loop gives up on an error it does not expect ("found an unhandled exception, quitting"),
e.g. when Redis disappears while a job runs, so `run` keeps a loop around it: when the RQ loop
ends without a stop request, it waits with capped backoff until Redis answers PING and starts
a new SimpleWorker. Signals lost with Redis are re-sent by the maintenance thread, which, like
the heartbeat thread, logs and retries through Redis and database outages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any

from app.core import pause, tracing
from app.core.dispatch import RQDispatcher, deletions_queue, run_job
from app.core.maintenance import Maintenance, maintenance_tasks, reconcile_and_signal
from app.core.settings import Settings, get_settings
from app.core.storage.erasure import compact_at_start, finish_compacting
from app.core.webhooks.sender import Sender
from workers import metrics
from workers.device import DeviceUnavailable, worker_device
from workers.lease import WORKER_ID, beat
from workers.recycle import Recycle

WARM_ENV = "LETHE_WARM_MODELS"  # set across a re-execution: the models to warm first
_CONTEXT: list[Any] = []  # this process's JobContext, made by `run` (one worker per process)


def run_signalled(job: str, *args: int) -> None:
    """What RQ runs for a signal (`app.core.dispatch.RQ_ENTRY`): the job, with the context this
    `lethe worker` built at start as its first argument."""
    (context,) = _CONTEXT
    run_job(context, job, *args)


if TYPE_CHECKING:  # imported where the device has been checked
    from workers.context import JobContext

log = logging.getLogger("lethe.worker")

RECONNECT_FIRST_SECONDS = 0.5  # first wait before pinging Redis again; doubles each time
RECONNECT_MAX_SECONDS = 15.0  # the cap of that backoff
HEALTHY_SECONDS = 60.0  # an RQ loop that ran this long starts the restart backoff afresh


def run(burst: bool = False, settings: Settings | None = None) -> None:
    """`lethe worker`: its settings from the environment unless given (tests)."""
    settings = settings or get_settings()
    if not settings.redis_url:
        raise SystemExit("lethe worker needs LETHE_REDIS_URL (embedded mode runs its own worker)")
    try:
        device = worker_device(settings)
    except DeviceUnavailable as exc:  # LETHE_DEVICE=cuda with no GPU: refuse to start
        raise SystemExit(f"lethe worker: {exc}") from exc
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    url = settings.resolved_database_url
    if settings.worker_metrics_port:
        metrics.serve(settings.worker_metrics_port)
    dispatcher = RQDispatcher(settings)
    from workers.context import JobContext  # after the device is checked

    tracing.configure("lethe-worker", settings.trace_sql)  # before the engines: SQL spans too
    ctx = JobContext.build(settings)
    # Neither the database nor Redis has to be up yet: the threads below retry both.
    _logged(lambda: beat(url, "rq"), "first heartbeat")
    _logged(lambda: reconcile_and_signal(ctx.runtime, dispatcher), "first reconcile")
    # keys destroyed by a process that died before compacting leave the files now
    _logged(lambda: compact_at_start(ctx.db, settings), "first compaction")
    stop = threading.Event()
    maintenance = Maintenance(maintenance_tasks(ctx.runtime, dispatcher))
    heart = threading.Thread(
        target=_heartbeat, args=(url, settings.heartbeat_seconds, stop), daemon=True
    )
    sender = Sender(ctx.db, ctx.runtime.keyring, settings)  # webhooks, off the API's process
    if not burst:
        maintenance.start()
        heart.start()
        sender.start()
    log.info(
        "worker %s listening on queue %r, computing on %s", WORKER_ID, settings.queue_name, device
    )
    where = _take_over(ctx)
    recycle = Recycle(ctx.db, settings.plaintext_ttl_seconds)
    _CONTEXT[:] = [ctx]  # the context RQ's jobs run with (`run_signalled`)
    stopping = Stopping()
    try:
        gave_way = serve(
            settings.redis_url, settings.queue_name, burst, recycle=recycle, stopping=stopping
        )
    finally:
        stop.set()
        if not burst:
            sender.stop()
        ctx.runtime.publisher.finish()  # the last update's checkpoint, before the process exits
        finish_compacting(ctx.db)  # and the compaction under way
    if gave_way:  # the same command in a fresh process image, none of this memory
        _give_way(ctx, where, stopping)


def _take_over(ctx: JobContext) -> str:
    """The resident states and sessions the process this one replaced held, taken in; the
    database's key they are held under."""
    from workers import handover
    from workers.data import database_key
    from workers.jobs import warm_model  # after the device is set up

    where = database_key(ctx.db.engine)
    ctx.resident_sessions().hand_in(where, handover.parsed(handover.from_memory_file(os.environ)))
    for model_id in [int(m) for m in os.environ.pop(WARM_ENV, "").split(",") if m]:
        warm_model(ctx, model_id)
    return where


def _give_way(ctx: JobContext, where: str, stopping: Stopping) -> None:
    """Re-execute this worker after an erasure: the same command in a fresh process image,
    handed the resident states it held (a memory file) and the models to warm. A stop
    that came meanwhile ends the process instead; one that comes during the re-execution
    stays pending (SIGTERM blocked across it) and `lethe worker` takes it as its first act:
    a lost one left a container's PID 1 deaf to it until the engine killed it."""
    from workers import handover

    held = ctx.resident_sessions().models(where)
    states = handover.exported_or_none(ctx)
    fd = handover.to_memory_file(states) if states else None
    log.info("worker %s gives way after an erasure: re-executing", WORKER_ID)
    pause.point(ctx.settings, "give-way", 0)
    logging.shutdown()
    env = {**os.environ, WARM_ENV: ",".join(str(m) for m in held)}
    if fd is not None:
        env[handover.FD_ENV] = str(fd)
    # the command line as it was given (`python -m app.launch worker` too: run as a script,
    # app/launch.py would put app/ first on the path, where a module of app/ could hide a
    # top-level package of the same name)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if stopping.requested:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        return
    os.execve(sys.executable, sys.orig_argv, env)


def _logged(step: Callable[[], object], what: str) -> None:
    try:
        step()
    except Exception:
        log.warning("%s failed; the background threads retry it", what, exc_info=True)


def _heartbeat(url: str, period: float, stop: threading.Event) -> None:
    while not stop.wait(period):
        try:
            beat(url, "rq")
        except Exception:
            log.warning("heartbeat failed", exc_info=True)


# ---- the RQ loop, restarted after Redis outages ---------------------------------------------


class Stopping:
    """Set by SIGTERM/SIGINT, whoever's handler is installed (RQ's or ours between two RQ
    loops). A plain flag polled by `wait`: safe to set from a signal handler."""

    def __init__(self) -> None:
        self.requested = False

    def set(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self.requested = True

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.set)
        signal.signal(signal.SIGINT, self.set)

    def wait(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self.requested and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.2, left))
        return self.requested


COMMAND_READ_SECONDS = 1.0  # how long RQ's command channel is read at a time


def _worker_class() -> type:
    from redis.exceptions import RedisError
    from rq import SimpleWorker

    class LetheWorker(SimpleWorker):
        """A SimpleWorker that tells `serve` whether its loop ended on a stop request."""

        stopping: Stopping
        recycle: Recycle | None = None
        gave_way = False
        # RQ's idle loop retries Redis itself, sleeping up to a minute between tries.
        max_connection_wait_time = RECONNECT_MAX_SECONDS

        idled = False

        def dequeue_job_and_maintain_ttl(self, timeout: Any, max_idle_time: Any = None) -> Any:
            found = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            self.idled = found is None and max_idle_time is not None
            return found

        def execute_job(self, job: Any, queue: Any) -> None:
            super().execute_job(job, queue)
            if self.recycle is not None and self.recycle.due(0.0):
                self.gave_way = self._stop_requested = True

        def subscribe(self) -> None:
            """RQ's command channel, read a second at a time: RQ reads it a minute at a
            time, and its teardown joins that read, so a stopped worker waited up to a
            minute before it exited."""
            self.pubsub = self.connection.pubsub()
            self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
            self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
                sleep_time=COMMAND_READ_SECONDS,
                daemon=True,
                exception_handler=self._pubsub_exception_handler,
            )

        def _install_signal_handlers(self) -> None:
            super()._install_signal_handlers()
            if self.stopping.requested:  # a signal came between two RQ loops
                self._stop_requested = True

        def request_stop(self, signum: int, frame: FrameType | None) -> None:
            self.stopping.set()
            try:
                super().request_stop(signum, frame)
            except RedisError:  # busy, and Redis is gone: stop after the job all the same
                self._stop_requested = True

    return LetheWorker


def serve(
    redis_url: str,
    queue_name: str,
    burst: bool = False,
    recycle: Recycle | None = None,
    stopping: Stopping | None = None,
) -> bool:
    """Run RQ SimpleWorkers on `queue_name` one after another until a stop request (or, in
    burst mode, an empty queue): a loop that ends for any other reason (Redis went away) is
    followed by a wait for Redis and a new worker. With `recycle`, a loop also ends when the
    process has lived through an erasure and should give way (then True: the caller
    re-executes the process), checked after each job and every few idle seconds."""
    from redis import Redis
    from redis.exceptions import RedisError
    from rq import Queue

    # RQ raises its connection's socket timeout above its blocking dequeue (minutes), so the
    # RQ loop gets a client of its own, and the PING that waits for Redis a short timeout.
    connection = Redis.from_url(redis_url, socket_connect_timeout=5)
    probe = Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=5)

    worker_class = _worker_class()
    stopping = stopping or Stopping()
    base = WORKER_ID.replace(":", "-")
    suffix = 0
    delay = RECONNECT_FIRST_SECONDS
    idle = None if recycle is None or burst else max(1, int(recycle.idle_seconds))
    while True:
        stopping.install()  # RQ's handlers belong to a finished loop
        if stopping.requested or not _wait_for_redis(probe, stopping):
            return False
        name = base if suffix == 0 else f"{base}-{suffix}"
        started = time.monotonic()
        worker = None
        try:
            worker = worker_class(
                [
                    Queue(deletions_queue(queue_name), connection=connection),  # first
                    Queue(queue_name, connection=connection),
                ],
                connection=connection,
                name=name,
            )
            worker.stopping, worker.recycle = stopping, recycle
            worker.work(with_scheduler=True, burst=burst, logging_level="INFO", max_idle_time=idle)
        except ValueError as exc:  # register_birth: "There exists an active worker named ..."
            if "active worker" not in str(exc):
                raise
            suffix += 1
            log.warning("%s; registering as %s-%d", exc, base, suffix)
            continue
        except (RedisError, OSError) as exc:  # from RQ's start-up or teardown
            log.warning("Redis failed around the RQ loop: %s", _describe(exc))
        finally:
            if worker is not None:
                _discard(worker)
        if burst or stopping.requested:  # a stop wins over giving way
            return False
        if worker is not None and worker.gave_way:
            return _giving_way(stopping)
        if worker is not None and worker.idled:  # max_idle_time: no outage
            if recycle is not None and recycle.due(recycle.idle_seconds):
                return _giving_way(stopping)
            continue
        delay = RECONNECT_FIRST_SECONDS if time.monotonic() - started > HEALTHY_SECONDS else delay
        log.warning(
            "the RQ loop of %s ended without a stop request (Redis outage?); reconnecting in %.1fs",
            name,
            delay,
        )
        if stopping.wait(delay):
            return False
        delay = min(delay * 2, RECONNECT_MAX_SECONDS)


def _giving_way(stopping: Stopping) -> bool:
    """True to give way. From here a stop is only noted (RQ's handler, still installed,
    raised in the middle of the hand-over), and `_give_way` ends the process instead."""
    stopping.install()
    return not stopping.requested


def _wait_for_redis(connection: Any, stopping: Stopping) -> bool:
    """Ping Redis with capped backoff until it answers (True) or a stop is requested."""
    delay = RECONNECT_FIRST_SECONDS
    while not stopping.requested:
        try:
            connection.ping()
            return True
        except Exception as exc:
            log.warning("Redis unreachable (%s); retrying in %.1fs", _describe(exc), delay)
        if stopping.wait(delay):
            break
        delay = min(delay * 2, RECONNECT_MAX_SECONDS)
    return False


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _discard(worker: Any) -> None:
    """What RQ's teardown may have left behind when Redis failed in it: the scheduler child
    and the pubsub thread (which otherwise retries its dead connection forever)."""
    process = getattr(worker.scheduler, "_process", None)
    if process is not None and process.is_alive():
        with contextlib.suppress(Exception):
            worker.stop_scheduler()
    thread = worker.pubsub_thread
    if thread is not None and thread.is_alive():
        with contextlib.suppress(Exception):
            thread.stop()
        with contextlib.suppress(Exception):
            thread.join(timeout=1)
        with contextlib.suppress(Exception):
            worker.pubsub.close()
