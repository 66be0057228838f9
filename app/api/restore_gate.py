"""The service stays shut while its database is behind the restore journal: a
restored backup serves nothing of a person erased after it was taken.

`RestoreGate` holds the verdict (app/core/services/restore.py), checked at start and, while it is
not `ok`, again at most every `RECHECK_SECONDS`. Its middleware answers 503 `restore_required`
to everything but health, readiness and metrics, and `restoring` to everything but those and
reading deletion requests (the restore's own, which an operator follows).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from sqlalchemy.exc import DBAPIError
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.errors import unavailable_response
from app.core.db.session import Database
from app.core.ledger.journal import Journal
from app.core.services.restore import Verdict, still_restoring, verdict

log = logging.getLogger("lethe.restore")
RECHECK_SECONDS = 2.0
OPEN_PATHS = ("/healthz", "/readyz", "/metrics")


class RestoreGate:
    """The last verdict, rechecked while it is not `ok`."""

    def __init__(self, db: Database, journal_dir: Path) -> None:
        self.db, self.journal_dir = db, journal_dir
        self._lock = threading.Lock()
        self._verdict: Verdict | None = None
        self._at = 0.0

    def check(self) -> Verdict:
        """The verdict now (read from the database unless `ok` or checked a moment ago)."""
        with self._lock:
            known = self._verdict
            if known is not None and (
                known.state == "ok" or time.monotonic() - self._at < RECHECK_SECONDS
            ):
                return known
            try:
                if known is not None and known.state == "restoring":
                    waiting = still_restoring(self.db, known.requests)
                    found = (
                        Verdict("restoring", known.reason, waiting) if waiting else Verdict("ok")
                    )
                else:
                    journal = Journal.of(self.journal_dir, self.db)  # migrated by now
                    found = verdict(self.db, journal, self.journal_dir)
            except DBAPIError:  # the database cannot say: the route will (503)
                log.debug("the restore verdict could not be read", exc_info=True)
                return known or Verdict("ok", "unchecked")
            except Exception as exc:  # noqa: BLE001 - the journal cannot say: shut, not open
                log.warning("the restore journal could not be compared", exc_info=True)
                return Verdict("behind", f"the restore journal could not be read: {exc}")
            if found.state != "ok" and (known is None or known.state != found.state):
                log.error("NOT READY: %s (docs/operations/backups.md)", found.reason)
            elif found.state == "ok" and known is not None and known.state != "ok":
                log.warning("the restore is complete: serving again")
            self._verdict, self._at = found, time.monotonic()
            return found


class RestoreGateMiddleware:
    """503 while the gate is shut, but for health, readiness, metrics and deletions' reads."""

    def __init__(self, app: ASGIApp, gate: RestoreGate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        found = self.gate.check()
        # while a restore re-applies erasures its requests can be read; before it, a lost
        # request would answer 404 though it was acknowledged: shut like the rest
        if found.state == "ok" or (found.state == "restoring" and _reading_deletions(scope)):
            await self.app(scope, receive, send)
            return
        if found.state == "behind":
            message = f"{found.reason}; an operator must run `lethe restore`"
            await unavailable_response("restore_required", message)(scope, receive, send)
        else:
            await unavailable_response("restoring", found.reason)(scope, receive, send)


def _reading_deletions(scope: Scope) -> bool:
    path: str = scope["path"]
    return scope["method"] in ("GET", "HEAD") and path.startswith("/v1/deletions")
