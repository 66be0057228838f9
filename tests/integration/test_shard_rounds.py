"""A round of shard tasks on a real Redis (workers/shards.py), with the parent's loop in a thread
and the test as the helper: a task a helper lets go is claimed by the parent at once (not a
lease later), a helper's result is the one the parent uses, and a round that is over takes no
result."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch
from redis import Redis

from app.core.settings import Settings
from methods.shards import ModelState, ShardTask
from workers.shards import _claim, _gather, _give_up, _Keys, _Round

pytestmark = pytest.mark.integration

LONG_LEASE = 600.0  # a task let go is never waited out


def task(shard: int) -> ShardTask:
    ids = torch.arange(4) + 10 * shard
    return ShardTask(shard, 1, None, ids, torch.zeros(4, dtype=torch.int64), torch.arange(4))


def states(shard: int) -> list[ModelState]:
    return [{"w": torch.full((2,), float(shard))}]


@pytest.fixture
def round_(redis_url: str) -> Any:
    keys = _Keys(f"rounds-{os.getpid()}", int.from_bytes(os.urandom(6), "big"))
    made = _Round(Redis.from_url(redis_url), keys, os.urandom(32), 3600)
    yield made
    made.redis.delete(*keys.all(3))


def test_a_task_let_go_is_taken_at_once_and_a_helpers_result_is_used(round_: Any) -> None:
    tasks = [task(k) for k in range(3)]
    round_.publish(b"wrapped", tasks)
    redis, keys = round_.redis, round_.keys
    assert _claim(redis, keys, 0, LONG_LEASE) and _claim(redis, keys, 2, LONG_LEASE)  # the helper
    computed: list[int] = []
    waiting = threading.Event()

    def local(t: ShardTask) -> list[ModelState]:
        computed.append(t.shard)
        if t.shard == 1:
            waiting.set()
        return states(t.shard)

    settings = Settings(lease_seconds=LONG_LEASE, heartbeat_seconds=0.5)
    out: list[list[list[ModelState]]] = []
    parent = threading.Thread(target=lambda: out.append(_gather(settings, round_, tasks, local)))
    parent.start()
    assert waiting.wait(60)  # the parent took the free task, and now waits for the others
    _give_up(redis, keys, 0, round_.ttl)
    assert round_.put_result(2, [{"w": torch.full((2,), 7.0)}])
    parent.join(60)
    assert not parent.is_alive() and sorted(computed) == [0, 1]  # task 0 taken back at once
    (results,) = out
    assert torch.equal(results[2][0]["w"], torch.full((2,), 7.0))  # the helper's, as it sent it
    assert torch.equal(results[0][0]["w"], torch.zeros(2))


def test_a_round_that_is_over_takes_no_result(round_: Any) -> None:
    round_.publish(b"wrapped", [task(0), task(1)])
    round_.redis.delete(*round_.keys.all(2))  # the parent is done with it
    assert not round_.put_result(1, states(1))
    assert not round_.redis.exists(round_.keys.result(1), round_.keys.done)


def test_what_redis_holds_of_a_task_is_sealed(round_: Any) -> None:
    round_.publish(b"wrapped", [task(3), task(4)])
    stored = round_.redis.get(round_.keys.task(0))
    assert stored is not None and b"ids" not in stored  # safetensors' names: not in the clear
    opened = round_.read(round_.keys.task(0))
    assert opened is not None
    decoded = ShardTask.decode(opened)
    assert decoded.shard == 3 and torch.equal(decoded.sample_ids, task(3).sample_ids)
