"""Named pause points for tests that must act at an exact moment of a job (e.g. kill -9 a
worker between compute and commit, or post while a registration is between chunks), instead of
racing a poll against it.

Off unless LETHE_PAUSE_DIR is set and LETHE_PAUSE_AT names the point. At a point, the process
writes `<name>-<id>.reached` (holding its pid) into that folder and waits until `<name>-<id>.go`
exists; `id` is the model's or the dataset's.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from app.core.settings import Settings

MAX_WAIT_SECONDS = 300.0


def point(settings: Settings, name: str, model_id: int) -> None:
    """Wait at the point `name` for `model_id` (a model's or a dataset's id) when a test set it."""
    folder = settings.pause_dir
    if folder is None or name not in settings.pause_at:
        return
    stem = Path(folder) / f"{name}-{model_id}"
    reached = stem.with_suffix(".reached")
    partial = stem.with_suffix(".reached.partial")  # written, then renamed: a test that sees
    partial.write_text(str(os.getpid()))  # the file always reads the whole pid
    partial.replace(reached)
    deadline = time.monotonic() + MAX_WAIT_SECONDS
    go = stem.with_suffix(".go")
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
