"""Run Alembic migrations to head programmatically (`lethe migrate`, embedded start, tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from app.core.settings import Settings

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent  # shipped in the wheel


def alembic_config(url: str, settings: Settings | None = None) -> Config:
    """Alembic's configuration for `url`; `settings` reach the migrations that seal data
    with the master key (0003), else they read the environment's."""
    cfg = Config(attributes={"settings": settings} if settings is not None else {})
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade_to_head(url: str, settings: Settings | None = None) -> None:
    """Bring the database at `url` to the newest schema."""
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    command.upgrade(alembic_config(url, settings), "head")
