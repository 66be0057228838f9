"""Signalling workers that a model has work: the job names, the dispatchers (inline, a worker
process, RQ) and the Redis keys the signals use.

The database is the record; the queue only carries "model M has work" signals, so any signal
may be lost or duplicated (app/core/maintenance.py reconciles). Jobs are named by dotted path:
`app` never imports `workers`.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from functools import partial
from typing import Any, Protocol

from app.core.lanes import Lanes
from app.core.runtime import Runtime
from app.core.settings import Settings
from app.core.signals import WaitingSignals
from app.core.worker_process import ProcessDispatcher

log = logging.getLogger("lethe.dispatch")

TRAIN = "workers.jobs.train_model"
DELETE = "workers.jobs.process_deletions"
WARM = "workers.jobs.warm_model"  # a session made ahead of an update (workers/recycle.py)
AUDIT = "workers.audits.run_audit"


class Dispatcher(Protocol):
    def enqueue(self, job: str, *args: int) -> None: ...
    def expect(self) -> None:
        """Work is coming soon (an append's learning, once its rows are in): a worker holds
        off what would delay it (the embedded worker's idle collection)."""
        ...

    def ping(self) -> bool: ...
    def depth(self) -> int: ...
    def metrics(self) -> bytes: ...


JOB_CONTEXT = "workers.context.JobContext"  # what a worker builds at start for its jobs
RQ_ENTRY = "workers.worker.run_signalled"  # what RQ runs: the job, with `lethe worker`'s context


def run_job(context: object, job: str, *args: int) -> None:
    """Import a job by dotted path and call it with the worker's context (a
    `workers.context.JobContext`, opaque here: `app` never imports `workers`)."""
    module, name = job.rsplit(".", 1)
    getattr(importlib.import_module(module), name)(context, *args)


def job_context(runtime: Runtime) -> object:
    """The context a thread-mode worker's jobs run with: the service's own Runtime (one
    publisher, one blob store, one keyring with the API) and the worker's own parts."""
    module, name = JOB_CONTEXT.rsplit(".", 1)
    return getattr(importlib.import_module(module), name).of(runtime)


class InlineDispatcher:
    """Embedded mode with LETHE_EMBEDDED_WORKER=thread: one worker thread of the API process
    runs the same job functions as RQ (the default is a process: app/core/worker_process.py),
    deletions first (app/core/lanes.py)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.context: object | None = None  # the worker's JobContext, made at start
        self._waiting = WaitingSignals()
        self._stopping = threading.Event()  # set by stop(); the running job checks it
        self._lanes: Lanes | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stopping.clear()
        self.context = job_context(self.runtime)  # tests look into it
        self._lanes = Lanes(
            self._stopping,
            partial(run_job, self.context),
            self._waiting.taken,
            frozenset({DELETE}),
        )
        self._thread = threading.Thread(
            target=self._lanes.serve, name="lethe-inline-worker", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Ask the running job to stop at its next check (app/core/shutdown.py), then wait."""
        if self._lanes is not None and self._thread is not None:
            self._stopping.set()
            self._lanes.close()
            self._thread.join(timeout=30)

    def enqueue(self, job: str, *args: int) -> None:
        if self._waiting.add((job, args)) and self._lanes is not None:
            self._lanes.put((job, args))  # else already waiting: one run sees all the work

    def expect(self) -> None:
        """Nothing to hold off: jobs run on this process's thread, which collects nothing."""

    def ping(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def depth(self) -> int:
        return self._lanes.depth() if self._lanes is not None else 0

    def metrics(self) -> bytes:
        """Nothing apart: the thread's counters are this process's."""
        return b""


def signal_key(queue_name: str, job: str, args: tuple[int, ...]) -> str:
    """The Redis key that marks a signal as waiting in the queue."""
    return f"lethe:{queue_name}:pending:{job}:{','.join(map(str, args))}"


DELETIONS_SUFFIX = "-deletions"


def deletions_queue(queue_name: str) -> str:
    """The RQ queue of deletion signals, listened to before `queue_name`."""
    return f"{queue_name}{DELETIONS_SUFFIX}"


def due_key(queue_name: str, model_id: int) -> str:
    """The Redis list a worker lingering on a model's lease blocks on (BLPOP): the API pushes
    to it after committing a deletion for that model, so the warm worker starts at once
    instead of at its next look at the database."""
    return f"lethe:{queue_name}:due:{model_id}"


DUE_TTL_SECONDS = 5  # a push nobody pops (no worker lingering) goes by itself


class DueList:
    """A worker's side of the models' due lists (`due_key`): what a worker lingering on a
    model's lease waits on, so no job knows the key format. Never raises: Redis
    carries wake-ups only, and the database is the record."""

    def __init__(self, redis_url: str, queue_name: str) -> None:
        self.redis_url, self.queue_name = redis_url, queue_name
        self._redis: Any = None

    def _connection(self) -> Any:
        if self._redis is None:
            from redis import Redis

            self._redis = Redis.from_url(self.redis_url, socket_timeout=5)
        return self._redis

    def forget(self, model_id: int) -> None:
        """Empty the model's list before a claim: the claim covers every push made before it,
        so a push left there would wake the lingering worker for tasks already applied."""
        try:
            self._connection().delete(due_key(self.queue_name, model_id))
        except Exception:  # noqa: BLE001 - Redis away: a stale push costs one empty claim
            log.debug("could not empty the due list of model %s", model_id, exc_info=True)

    def wait(self, model_id: int, timeout: float) -> bool:
        """Until the API pushes for the model (True) or `timeout` passes; a sleep when Redis
        is away (a lost wake-up costs one fallback look at the database)."""
        key = due_key(self.queue_name, model_id)
        try:
            return self._connection().blpop([key], timeout=timeout) is not None
        except Exception:  # noqa: BLE001 - Redis away: poll the database instead
            log.debug("could not wait on %s", key, exc_info=True)
            time.sleep(timeout)
            return False


def take_signal(job: str, *args: int) -> None:
    """Called by a job as it starts: its signal is no longer waiting, so the next request
    signals again (it may arrive after this job read the database). No-op inline."""
    from rq import get_current_job

    current = get_current_job()
    if current is not None:
        try:
            # the key is named after the base queue whichever queue the job came from
            base = current.origin.removesuffix(DELETIONS_SUFFIX)
            current.connection.delete(signal_key(base, job, args))
        except Exception:  # Redis gone: the key expires on its own
            log.warning("could not clear the pending signal of %s%s", job, args, exc_info=True)


class RQDispatcher:
    """Distributed mode: RQ on Redis carries signals with a job timeout. A failed attempt is
    put back in the database with a backoff and re-signalled by the reconciler, so there is
    one retry policy in both modes.

    At most one signal per (job, model) waits in the queue: `SET NX` on a pending
    key, cleared by the job as it starts (`take_signal`) and expiring after
    `signal_ttl_seconds`, so a signal lost with its job is re-sent by the reconciler soon."""

    def __init__(self, settings: Settings) -> None:
        from redis import Redis
        from rq import Queue

        if not settings.redis_url:
            raise ValueError("the RQ dispatcher needs LETHE_REDIS_URL")
        self.settings = settings
        self.redis = Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
        self.queue = Queue(settings.queue_name, connection=self.redis)
        # deletions on a queue of their own, which every `lethe worker` takes from first
        # (RQ dequeues in the order of its queues; deletions first)
        self.deletions = Queue(deletions_queue(settings.queue_name), connection=self.redis)

    def enqueue(self, job: str, *args: int) -> None:
        try:  # no RQ retries: failed attempts are retried from the database (fail_tasks)
            pending = signal_key(self.settings.queue_name, job, args)
            batch = self.redis.pipeline(transaction=False)  # one round trip
            if job == DELETE:  # wake a worker lingering on the model's lease
                due = due_key(self.settings.queue_name, args[0])
                batch.rpush(due, 1)
                batch.expire(due, DUE_TTL_SECONDS)
            batch.set(pending, 1, nx=True, ex=self.settings.signal_ttl_seconds)
            if not batch.execute()[-1]:
                return  # a signal for this model is already waiting: its job will see this
            try:
                (self.deletions if job == DELETE else self.queue).enqueue(
                    RQ_ENTRY,
                    job,
                    *args,
                    job_timeout=self.settings.job_timeout_seconds,
                    failure_ttl=7 * 24 * 3600,
                    result_ttl=3600,
                )
            except Exception:
                self.redis.delete(pending)  # nothing waits: the reconciler may signal again
                raise
        except Exception:  # Redis down: the request is durable; the reconciler re-signals it
            log.warning(
                "could not enqueue %s%s; the reconciler will retry", job, args, exc_info=True
            )

    def expect(self) -> None:
        """Nothing to hold off: `lethe worker`s take their jobs from RQ as they come."""

    def ping(self) -> bool:
        try:
            return bool(self.redis.ping())
        except Exception:
            return False

    def depth(self) -> int:
        try:
            return self.queue.count + self.deletions.count
        except Exception:
            return -1

    def metrics(self) -> bytes:
        """Nothing: each `lethe worker` serves its own (LETHE_WORKER_METRICS_PORT)."""
        return b""


def make_dispatcher(runtime: Runtime) -> InlineDispatcher | ProcessDispatcher | RQDispatcher:
    """RQ with Redis; else the embedded worker, a child process or a thread (which shares
    the API's Runtime)."""
    settings = runtime.settings
    if not settings.embedded:
        return RQDispatcher(settings)
    if settings.embedded_worker == "process":
        return ProcessDispatcher(settings)
    return InlineDispatcher(runtime)
