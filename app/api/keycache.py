"""Verified API keys, remembered for a moment (issue 13): every request checks its key, and a
database round trip per request was a tenth of the request path's time under load.

A revocation in this process forgets the key at once; another API process notices within
`LETHE_KEY_CACHE_SECONDS` (default 2 s; 0 turns the cache off).
"""

from __future__ import annotations

import threading
import time

from starlette.concurrency import run_in_threadpool

from app.db.session import Database
from app.db.tables import ApiKey
from app.security import hash_key, lookup_key
from app.settings import get_settings

_lock = threading.Lock()
_known: dict[tuple[str, str], tuple[float, ApiKey]] = {}  # (database url, key hash) -> entry
MAX_ENTRIES = 10_000


def cached_key(db: Database, raw: str) -> ApiKey | None:
    """The key if this process verified it within the cache's lifetime; None when it must be
    looked up (`known_key`). Never blocks: the event loop calls it before any thread hop."""
    with _lock:
        entry = _known.get((db.url, hash_key(raw)))
    return entry[1] if entry is not None and entry[0] > time.monotonic() else None


async def verified_key(db: Database, raw: str) -> ApiKey | None:
    """`known_key` for the event loop: a cached key costs no thread hop (issue 28: each hop
    was CPU on the request path); a miss is looked up in the thread pool."""
    return cached_key(db, raw) or await run_in_threadpool(known_key, db, raw)


def known_key(db: Database, raw: str) -> ApiKey | None:
    """A known key that is not revoked (cached); None otherwise (never cached)."""
    if (key := cached_key(db, raw)) is not None:
        return key
    ttl = get_settings().key_cache_seconds
    now = time.monotonic()
    with db.read() as session:
        key = lookup_key(session, raw)
    if key is not None and ttl > 0:
        with _lock:
            if len(_known) >= MAX_ENTRIES:
                _known.clear()
            _known[(db.url, hash_key(raw))] = (now + ttl, key)
    return key


def forget(key_hash: str | None = None) -> None:
    """Drop a revoked key (or all keys) from this process's cache."""
    with _lock:
        if key_hash is None:
            _known.clear()
        else:
            for entry_key in [k for k in _known if k[1] == key_hash]:
                del _known[entry_key]
