"""Training gives the same bits whatever torch's thread count: an exact retrain made by a
worker with other settings, or under another load, is the same model."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from maths.training import train


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_one_thread_and_four_train_the_same_bits(threads: None) -> None:
    gen = torch.Generator().manual_seed(0)
    X = torch.randn(4096, 96, generator=gen)
    y = (X[:, 0] + X[:, 1] > 0).long()
    spec = {"type": "mlp", "hidden": [256, 64]}
    config = {"epochs": 2, "batch_size": 512, "learning_rate": 0.1, "seed": 3}
    states = []
    for count in (1, 4):
        torch.set_num_threads(count)
        states.append(train(spec, config, X, y, 2))
    one, four = states
    assert one.keys() == four.keys()
    for name in one:
        assert torch.equal(one[name], four[name]), name
