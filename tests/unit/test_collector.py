"""The worker's garbage collection (workers/collector.py): what a job leaves is frozen, and
cyclic garbage among it is reclaimed once the worker idles, not never."""

from __future__ import annotations

import gc
import weakref

import pytest

from workers.collector import Collector


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> _Node:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return a


def test_a_job_s_survivors_are_frozen_and_an_idle_spell_reclaims_their_cycles() -> None:
    collector = Collector(idle_seconds=0.5)
    held = {"node": _cycle()}
    gone = weakref.ref(held["node"])
    try:
        collector.around(lambda: None)()
        assert gc.get_freeze_count() > 0
        held.clear()  # now cyclic garbage, frozen: an ordinary collection skips it
        gc.collect()
        assert gone() is not None
        collector.idle(0.1)  # not idle long enough: nothing happens
        assert gone() is not None
        collector.idle(1.0)
        assert gone() is None
        collector.idle(5.0)  # once per idle spell: nothing left to do
    finally:
        gc.unfreeze()


def test_a_job_that_raises_still_freezes() -> None:
    collector = Collector()

    def fails() -> None:
        raise RuntimeError("boom")

    try:
        with pytest.raises(RuntimeError):
            collector.around(fails)()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_an_expected_job_holds_the_idle_collection_off_until_it_has_run() -> None:
    """An append's POST announces its learning (`expect`): the idle collection (0.36 s with a
    million-row session) waits, so the learning does not wait for it. Once a job
    has run, or the hold has passed, the idle spell collects as before."""
    collector = Collector(idle_seconds=0.5, expect_seconds=60.0)
    held = {"node": _cycle()}
    gone = weakref.ref(held["node"])
    try:
        collector.around(lambda: None)()
        held.clear()
        collector.expect()
        assert not collector.idle(5.0)  # idle, but a job is coming
        assert gone() is not None
        collector.around(lambda: None)()  # it came
        assert collector.idle(1.0)
        assert gone() is None
        short = Collector(idle_seconds=0.5, expect_seconds=0.0)  # a hold that has passed
        short.around(lambda: None)()
        short.expect()
        assert short.idle(1.0)
    finally:
        gc.unfreeze()


def test_a_hold_gives_way_once_the_garbage_has_waited_long_enough(monkeypatch) -> None:
    """Appends back to back each announce a job: the collection still comes once what it
    would reclaim has waited HELD_MOST."""
    from workers import collector as module

    collector = Collector(idle_seconds=0.5, expect_seconds=3600.0)
    try:
        collector.around(lambda: None)()
        collector.expect()
        assert not collector.idle(1.0)
        monkeypatch.setattr(module, "HELD_MOST", 0.0)
        assert collector.idle(1.0)
    finally:
        gc.unfreeze()
