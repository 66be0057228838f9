"""The default size limits follow the machine's memory and the service's bound (every
process together within 1.5 × the rows' float32 bytes + 1 GiB), and a refusal names the
setting that raises it."""

from __future__ import annotations

import pytest

from app.core import settings as settings_module
from app.core.errors import APIError
from app.core.formats.dataset_files import Limits, check_size
from app.core.settings import Settings

GiB = 2**30


def on_machine(monkeypatch: pytest.MonkeyPatch, memory: int, **given: int) -> Limits:
    monkeypatch.setattr(settings_module, "physical_memory", lambda: memory)
    for name in ("LETHE_MAX_DATASET_CELLS", "LETHE_MAX_DATASET_SAMPLES"):
        monkeypatch.delenv(name, raising=False)
    return Limits.from_settings(Settings(**given))  # type: ignore[arg-type]


def test_ten_million_rows_of_256_fit_a_24_gib_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = on_machine(monkeypatch, 24 * GiB)
    assert limits.max_cells == int(23 * GiB / 6) and limits.max_cells >= 10_000_000 * 256
    assert limits.max_samples >= 10_000_000
    check_size(10_000_000, 256, limits)  # no refusal


def test_a_smaller_machine_refuses_and_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = on_machine(monkeypatch, 8 * GiB)
    with pytest.raises(APIError) as refused:
        check_size(10_000_000, 256, limits)
    assert refused.value.status == 413 and refused.value.code == "dataset_too_large"
    assert "LETHE_MAX_DATASET_CELLS" in refused.value.message
    assert refused.value.details["setting"] == "LETHE_MAX_DATASET_CELLS"


def test_a_setting_given_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = on_machine(monkeypatch, 24 * GiB, max_dataset_cells=1000, max_dataset_samples=10)
    assert (limits.max_cells, limits.max_samples) == (1000, 10)
    with pytest.raises(APIError) as refused:
        check_size(11, 1, limits)
    assert refused.value.code == "too_many_samples"
    assert "LETHE_MAX_DATASET_SAMPLES" in refused.value.message
