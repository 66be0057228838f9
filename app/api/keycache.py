"""Verified API keys, remembered for a moment: every request checks its key, and a
database round trip per request was a tenth of the request path's time under load.

One `KeyCache` per app (app.state.key_cache; nothing process-wide). A revocation
through this app forgets the key at once; another API process notices within
`LETHE_KEY_CACHE_SECONDS` (default 2 s; 0 turns the cache off).
"""

from __future__ import annotations

import threading
import time

from starlette.concurrency import run_in_threadpool

from app.core.db.session import Database
from app.core.db.tables import ApiKey
from app.core.security import hash_key, lookup_key

MAX_ENTRIES = 10_000


class KeyCache:
    """The keys of one database verified within the last `ttl` seconds."""

    def __init__(self, db: Database, ttl: float) -> None:
        self.db, self.ttl = db, ttl
        self._lock = threading.Lock()
        self._known: dict[str, tuple[float, ApiKey]] = {}  # key hash -> (expiry, key)

    def cached(self, raw: str) -> ApiKey | None:
        """The key if verified within the cache's lifetime; None when it must be looked up
        (`known`). Never blocks: the event loop calls it before any thread hop."""
        with self._lock:
            entry = self._known.get(hash_key(raw))
        return entry[1] if entry is not None and entry[0] > time.monotonic() else None

    async def verified(self, raw: str) -> ApiKey | None:
        """`known` for the event loop: a cached key costs no thread hop (each hop
        was CPU on the request path); a miss is looked up in the thread pool."""
        return self.cached(raw) or await run_in_threadpool(self.known, raw)

    def known(self, raw: str) -> ApiKey | None:
        """A known key that is not revoked (cached); None otherwise (never cached)."""
        if (key := self.cached(raw)) is not None:
            return key
        now = time.monotonic()
        with self.db.read() as session:
            key = lookup_key(session, raw)
        if key is not None and self.ttl > 0:
            with self._lock:
                if len(self._known) >= MAX_ENTRIES:
                    self._known.clear()
                self._known[hash_key(raw)] = (now + self.ttl, key)
        return key

    def forget(self, key_hash: str | None = None) -> None:
        """Drop a revoked key (or all keys)."""
        with self._lock:
            if key_hash is None:
                self._known.clear()
            else:
                self._known.pop(key_hash, None)
