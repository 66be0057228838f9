"""Access logs without query strings: `?subject=person-7` must not land in a log."""

from __future__ import annotations

import logging


class DropQueryString(logging.Filter):
    """Rewrite uvicorn's access record `(client, method, path?query, version, status)` so the
    path keeps no query string."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            path = args[2].split("?", 1)[0]
            record.args = (args[0], args[1], path, args[3], args[4])
        return True


def install() -> None:
    """Attach the filter to uvicorn's access logger (idempotent)."""
    logger = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, DropQueryString) for f in logger.filters):
        logger.addFilter(DropQueryString())
