"""A resident session grows by an append without copying its rows: they go into the room
its buffer keeps after them (`workers.resident.extended`)."""

from __future__ import annotations

import numpy as np
import torch

from workers.data import Arrays
from workers.resident import SPARE_SHARE, ModelSession, appended, extended


def test_rows_go_into_the_room_after_the_first_growth() -> None:
    rows = torch.arange(800 * 4, dtype=torch.float32).reshape(800, 4)
    first = extended(rows, torch.ones(10, 4))
    assert torch.equal(first[:800], rows) and bool((first[800:] == 1).all())
    room = first.untyped_storage().nbytes() // (4 * 4) - len(first)
    assert room == 810 // SPARE_SHARE
    second = extended(first, torch.full((room, 4), 7.0))  # fills the room: no new buffer
    assert second.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    assert torch.equal(second[:800], rows) and bool((second[810:] == 7).all())
    third = extended(second, torch.full((1, 4), 9.0))  # no room left: a new buffer
    assert third.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    assert torch.equal(third[: len(second)], second) and bool((third[-1] == 9).all())


def test_labels_grow_the_same_way() -> None:
    y = torch.arange(100)
    grown = extended(extended(y, torch.tensor([5, 6])), torch.tensor([9]))
    assert grown.tolist() == [*range(100), 5, 6, 9]


def test_a_shared_test_split_is_copied_once_then_grows_in_its_own_room() -> None:
    """Sessions of one dataset read the opened cache's test split: the first append copies
    it (with room) and leaves the cache's buffer, room included, untouched; the next ones
    write into the session's own room (a copy of the whole split each time held the worker
    for 0.7 s after every append at ten million rows)."""
    ids = list(range(0, 40, 2))
    rows = Arrays(ids, [f"e{i}" for i in ids], torch.zeros(20, 3), torch.zeros(20).long(),
                  [None] * 20)  # fmt: skip
    test_ids = list(range(1, 33, 2))
    cache = torch.zeros(24, 3)  # the cache's buffer: 16 rows and room after them
    test = Arrays(test_ids, [f"t{i}" for i in test_ids], cache[:16], torch.zeros(16).long(),
                  [None] * 16)  # fmt: skip
    session = ModelSession.of(1, 7, rows, {"w": torch.ones(3)}, test)
    assert not session.test_owned

    def appended(at: int) -> tuple[Arrays, Arrays]:
        train = Arrays([100 + at], [f"a{at}"], torch.ones(1, 3), torch.ones(1).long(), [None])
        held = Arrays([101 + at], [f"b{at}"], torch.full((1, 3), float(at)), torch.ones(1).long(),
                      [None])  # fmt: skip
        return train, held

    once = session.grown(*appended(1))
    assert once.test_owned and once.test.X.data_ptr() != cache.data_ptr()
    assert not cache.any()  # the cache's room was not written
    twice = once.grown(*appended(2))
    assert twice.test.X.untyped_storage().data_ptr() == once.test.X.untyped_storage().data_ptr()
    assert twice.test.X[:, 0].tolist() == [0] * 16 + [1, 2] and twice.test.sample_ids[-1] == 103


def test_ids_and_marks_grow_in_their_room_too() -> None:
    ids = appended(np.arange(80, dtype=np.int64), np.array([100], dtype=np.int64))
    again = appended(ids, np.array([101, 102], dtype=np.int64))  # room of 81 // 8 = 10
    assert again.tolist() == [*range(80), 100, 101, 102]
    assert again.__array_interface__["data"][0] == ids.__array_interface__["data"][0]
    names = appended(appended(np.array(["a"], dtype=object), np.array(["b"], dtype=object)),
                     np.array(["c"], dtype=object))  # fmt: skip
    assert names.tolist() == ["a", "b", "c"]
