"""A sharded model's shard tasks across the worker pool (distributed mode).

The worker running an update or a training (the parent) puts its shard tasks in Redis and
queues a helper job for each task but its first; then it claims and computes tasks itself,
and waits for the others' results. A claim is a key that expires unless its holder renews it:
a task whose worker dies mid-shard is claimed again (by the parent when it runs out of its own)
and computed again, to the same bits (SISA's stages are functions of their checkpoint, rows and
seed). The parent commits once; a result computed twice is read once. With one worker, the
parent computes every task and its helper jobs find the round over.

Redis holds a task's sample ids and start checkpoint and a result's stage states, never rows,
sealed with the round's own data key (wrapped by the master key, as a blob's is), until the
parent deletes the round; a helper writes a result only while its round exists, and a round
whose parent died expires with the longest a job may run.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from redis import Redis
from redis.exceptions import WatchError
from rq import Queue
from sqlalchemy.orm import Session

from app.core import pause, shutdown
from app.core.db.tables import Dataset, Model
from app.core.dispatch import RQ_ENTRY, deletions_queue
from app.core.settings import Settings
from app.core.storage.crypto import open_sealed, seal
from methods.compute import UnlearningMethod, method_for
from methods.shards import (
    IN_PROCESS,
    LocalFn,
    ModelState,
    ShardRunner,
    ShardTask,
    decode_states,
    encode_states,
)
from workers.context import JobContext
from workers.load import model_spec
from workers.metrics import SHARD_TASKS

log = logging.getLogger("lethe.shards")

HELP = "workers.shards.help_shards"
GAVE_UP = -1  # pushed to a round's `done` list by a helper that let its task go


def shard_runner(ctx: JobContext, model_id: int) -> ShardRunner:
    """Across the worker pool in distributed mode; here in embedded mode."""
    if ctx.settings.embedded:
        return IN_PROCESS
    return PoolShards(ctx, model_id)


class _Keys:
    """The Redis keys of one round of shard tasks."""

    def __init__(self, queue: str, round_id: int) -> None:
        self.base = f"{queue}:shards:{round_id}"

    def task(self, i: int) -> str:
        return f"{self.base}:task:{i}"

    def claim(self, i: int) -> str:
        return f"{self.base}:claim:{i}"

    def result(self, i: int) -> str:
        return f"{self.base}:result:{i}"

    @property
    def count(self) -> str:
        return f"{self.base}:count"

    @property
    def key(self) -> str:
        return f"{self.base}:key"  # the round's data key, wrapped

    @property
    def done(self) -> str:
        return f"{self.base}:done"  # a list: each finished task's index, for the parent's wait

    def all(self, n: int) -> list[str]:
        per_task = [k for i in range(n) for k in (self.task(i), self.claim(i), self.result(i))]
        return [*per_task, self.count, self.key, self.done]


class PoolShards:
    """`ShardRunner` over RQ and Redis: the parent computes tasks too, so a round never waits
    on a worker that is not there."""

    def __init__(self, ctx: JobContext, model_id: int) -> None:
        self.ctx, self.model_id = ctx, model_id

    def run(self, tasks: Sequence[ShardTask], local: LocalFn) -> list[list[ModelState]]:
        if len(tasks) < 2:
            return IN_PROCESS.run(tasks, local)
        settings = self.ctx.settings
        redis = _redis(self.ctx)
        round_id = secrets.randbits(62)
        keys = _Keys(settings.queue_name, round_id)
        raw, wrapped = self.ctx.keyring.new_data_key()
        round_ = _Round(redis, keys, raw, settings.job_timeout_seconds)
        try:
            round_.publish(wrapped, tasks)
            helpers = Queue(deletions_queue(settings.queue_name), connection=redis)
            for _ in tasks[1:]:
                helpers.enqueue(
                    RQ_ENTRY,
                    HELP,
                    self.model_id,
                    round_id,
                    job_timeout=settings.job_timeout_seconds,
                    result_ttl=60,
                    failure_ttl=24 * 3600,
                )
            pause.point(settings, "shards-published", self.model_id)
            return _gather(settings, round_, tasks, local)
        finally:
            redis.delete(*keys.all(len(tasks)))
            redis.close()


class _Round:
    """One round's keys, read and written sealed with its data key."""

    def __init__(self, redis: Redis, keys: _Keys, raw: bytes, ttl: int) -> None:
        self.redis, self.keys, self.raw, self.ttl = redis, keys, raw, ttl

    def publish(self, wrapped: bytes, tasks: Sequence[ShardTask]) -> None:
        batch = self.redis.pipeline(transaction=False)
        batch.set(self.keys.key, wrapped, ex=self.ttl)
        for i, task in enumerate(tasks):
            name = self.keys.task(i)
            batch.set(name, seal(self.raw, task.encode(), name), ex=self.ttl)
        batch.set(self.keys.count, len(tasks), ex=self.ttl)  # last: a helper reads it first
        batch.execute()

    def read(self, name: str) -> bytes | None:
        value = self.redis.get(name)
        assert value is None or isinstance(value, bytes)  # this client does not decode
        return open_sealed(self.raw, value, name) if value else None

    def put_result(self, i: int, states: list[ModelState]) -> bool:
        """Write task i's result and announce it, unless the round is over (its parent
        deleted it): nothing of a round outlives it. False: over."""
        name = self.keys.result(i)
        sealed = seal(self.raw, encode_states(states), name)
        with self.redis.pipeline() as pipe:
            try:
                pipe.watch(self.keys.count)
                if not pipe.exists(self.keys.count):
                    return False
                pipe.multi()
                pipe.set(name, sealed, ex=self.ttl)
                pipe.rpush(self.keys.done, i)
                pipe.expire(self.keys.done, self.ttl)
                pipe.execute()
            except WatchError:  # deleted meanwhile
                return False
        return True

    @staticmethod
    def joined(ctx: JobContext, redis: Redis, keys: _Keys) -> _Round | None:
        """A helper's view of a round (None: over)."""
        wrapped = redis.get(keys.key)
        if not isinstance(wrapped, bytes):
            return None
        raw = ctx.keyring.unwrap(wrapped)
        return _Round(redis, keys, raw, ctx.settings.job_timeout_seconds)


def _redis(ctx: JobContext) -> Redis:
    """Blocking reads wait up to a lease: the socket's own timeout is longer."""
    url = ctx.settings.redis_url
    assert url, "distributed mode"
    return Redis.from_url(url, socket_timeout=ctx.settings.lease_seconds + 30)


def _gather(
    settings: Settings, round_: _Round, tasks: Sequence[ShardTask], local: LocalFn
) -> list[list[ModelState]]:
    """Claim and compute tasks here while any is free; then wait for the helpers' results,
    taking over a task whose claim lapsed (its worker died)."""
    results: dict[int, list[ModelState]] = {}
    lease = settings.lease_seconds
    redis, keys = round_.redis, round_.keys
    while len(results) < len(tasks):
        shutdown.check()
        free = next((i for i in range(len(tasks)) if _free(redis, keys, i, results, lease)), None)
        if free is not None:
            with _renewing(redis, keys.claim(free), settings.heartbeat_seconds, lease):
                results[free] = local(tasks[free])
            SHARD_TASKS.labels("here").inc()
            redis.set(keys.result(free), b"", ex=round_.ttl)  # taken: nobody redoes it
            continue
        popped = redis.blpop([keys.done], timeout=max(1, int(lease)))
        if popped is None:
            continue  # no result within a lease: look for a lapsed claim
        i = int(popped[1])
        if i == GAVE_UP:
            continue  # a helper let its task go: claim it
        stored = round_.read(keys.result(i))
        if i not in results and stored:
            results[i] = decode_states(stored)
    return [results[i] for i in range(len(tasks))]


def _free(
    redis: Redis, keys: _Keys, i: int, results: dict[int, list[ModelState]], lease: float
) -> bool:
    """Whether the parent claimed task i just now (not one it has, nor one claimed or done)."""
    return i not in results and _claim(redis, keys, i, lease)


def _give_up(redis: Redis, keys: _Keys, i: int, ttl: int) -> None:
    """Let task i go and wake the parent to claim it (without waiting out the lease)."""
    with contextlib.suppress(Exception):  # Redis away: the claim lapses on its own
        batch = redis.pipeline(transaction=False)
        batch.delete(keys.claim(i))
        batch.rpush(keys.done, GAVE_UP)
        batch.expire(keys.done, ttl)  # the round may be over: nothing of it stays
        batch.execute()


def _claim(redis: Redis, keys: _Keys, i: int, lease: float) -> bool:
    """Claim task i unless it is claimed or has its result."""
    if redis.exists(keys.result(i)):
        return False
    return bool(redis.set(keys.claim(i), 1, nx=True, ex=max(1, int(lease))))


@contextlib.contextmanager
def _renewing(redis: Redis, key: str, every: float, lease: float) -> Iterator[None]:
    """Keep a claim alive while its task computes (a dead worker stops renewing it)."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(every):
            with contextlib.suppress(Exception):  # Redis away a moment: the next try renews
                redis.set(key, 1, xx=True, ex=max(1, int(lease)))

    thread = threading.Thread(target=renew, name="lethe-shard-claim", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def help_shards(ctx: JobContext, model_id: int, round_id: int) -> str:
    """A helper job: claim the round's free tasks one at a time and compute each on rows this
    worker opens itself; nothing to do once the round is over."""
    redis = _redis(ctx)
    try:
        return _help(ctx, redis, model_id, round_id)
    finally:
        redis.close()


def _help(ctx: JobContext, redis: Redis, model_id: int, round_id: int) -> str:
    settings = ctx.settings
    keys = _Keys(settings.queue_name, round_id)
    count, round_ = redis.get(keys.count), _Round.joined(ctx, redis, keys)
    if count is None or round_ is None:
        return "round over"
    done = 0
    for i in range(int(count)):
        if not _claim(redis, keys, i, settings.lease_seconds):
            continue
        with _renewing(redis, keys.claim(i), settings.heartbeat_seconds, settings.lease_seconds):
            encoded = round_.read(keys.task(i))
            if encoded is None:
                break
            pause.point(settings, "shard-task", model_id)  # (a test kills the helper here)
            try:
                states = _compute(ctx, model_id, ShardTask.decode(encoded))
            except BaseException:  # failed or stopped: the parent takes the task at once
                _give_up(redis, keys, i, round_.ttl)
                raise
        if not round_.put_result(i, states):
            break
        SHARD_TASKS.labels("helper").inc()
        log.info("computed shard task %d of model %d's round %d", i, model_id, round_id)
        done += 1
    return f"computed {done} shard tasks"


def _compute(ctx: JobContext, model_id: int, task: ShardTask) -> list[ModelState]:
    """A task's stages on the rows it names, opened here (one short read), on this worker's
    device."""
    device = ctx.device()
    with ctx.db.read() as session:
        method, X, y = _opened(session, ctx, model_id, task.sample_ids)
    X, y = X.to(device), y.to(device)
    return method.run_shard_task(task, lambda at: (X[at], y[at]))


def _opened(
    session: Session, ctx: JobContext, model_id: int, ids: torch.Tensor
) -> tuple[UnlearningMethod, torch.Tensor, torch.Tensor]:
    """The model's method and the rows `ids` in their given order."""
    model = session.get(Model, model_id)
    dataset = session.get(Dataset, model.dataset_id) if model is not None else None
    if model is None or dataset is None:
        raise LookupError(f"model {model_id} is gone")
    spec = model_spec(model, dataset)
    method = method_for(spec.method.name, spec)
    order = np.argsort(ids.numpy(), kind="stable")
    arrays = ctx.opened.arrays(session, dataset, ids.numpy()[order].tolist(), "shards")
    back = torch.from_numpy(np.argsort(order, kind="stable"))
    return method, arrays.X[back], arrays.y[back]
