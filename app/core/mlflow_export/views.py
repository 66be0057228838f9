"""A version's MLflow copy as the API shows it."""

from __future__ import annotations

from typing import Any

from app.core.db.tables import MlflowExport


def export_view(row: MlflowExport | None) -> dict[str, Any] | None:
    """A version's MLflow copy as the API shows it."""
    if row is None:
        return None
    return {
        "status": str(row.status),
        "registered_model": row.registered_model,
        "version": row.mlflow_version,
        "run_id": row.run_id,
        "attempts": row.attempts,
        "seconds": row.seconds,
        "last_error": row.last_error,
        "registered_at": row.registered_at,
        "purged_at": row.purged_at,
    }
