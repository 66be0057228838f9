"""Alembic's migrations of Lethe's schema (render_as_batch for SQLite). A package so that the
wheel ships them and an installed `lethe migrate` finds them (app/core/db/migrate.py)."""
