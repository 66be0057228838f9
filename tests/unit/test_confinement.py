"""A machine can confine the suite: LETHE_TEST_PORTS bounds every port a test's servers take."""

from __future__ import annotations

import pytest

from tests.support.cluster import confined_ports, free_port


def test_ports_come_from_the_range_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LETHE_TEST_PORTS", "23100-23119")
    assert confined_ports() == (23100, 23119)
    assert all(23100 <= free_port() <= 23119 for _ in range(50))


@pytest.mark.parametrize("bad", ["80-90", "30000-20000", "x-y", "70000"])
def test_a_malformed_range_is_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("LETHE_TEST_PORTS", bad)
    with pytest.raises(ValueError):
        confined_ports()


def test_without_it_ports_stay_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LETHE_TEST_PORTS", raising=False)
    assert confined_ports() is None
    assert 1024 <= free_port() < 65536
