"""A resident session grows by an append without copying its rows: they go into the room
its buffer keeps after them (`workers.resident.extended`)."""

from __future__ import annotations

import torch

from workers.resident import SPARE_SHARE, extended


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
