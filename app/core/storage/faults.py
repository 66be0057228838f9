"""Faults, not verdicts: a full disk, an I/O error or a store outage says nothing of
the update, so the job waits and retries it rather than counting it toward withdrawal.

`is_fault(exc)` looks through an exception's causes for one: the object store unreachable
(`BlobStoreUnavailable`), an `OSError` whose errno is a full, failing or read-only device, or a
database that says the same (SQLite's "database or disk is full", "disk I/O error";
PostgreSQL's class 53 and 58 errors: insufficient resources, system errors).
"""

from __future__ import annotations

import errno

from app.core.storage.objects import BlobStoreUnavailable

DEVICE_ERRNOS = frozenset({errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS})
SQLITE_MESSAGES = ("database or disk is full", "disk i/o error")
POSTGRES_CLASSES = ("53", "58")  # insufficient resources; system error (I/O)


def is_fault(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is a storage fault."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _is_one(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _is_one(exc: BaseException) -> bool:
    if isinstance(exc, BlobStoreUnavailable):
        return True
    if isinstance(exc, OSError) and exc.errno in DEVICE_ERRNOS:
        return True
    message = str(exc).lower()
    if type(exc).__module__.startswith("sqlite3") and any(m in message for m in SQLITE_MESSAGES):
        return True
    code = getattr(exc, "sqlstate", None)
    return isinstance(code, str) and code[:2] in POSTGRES_CLASSES


def fault_text(exc: BaseException) -> str:
    """What a task's `error` says while it waits: the fault's kind, no path or value."""
    current: BaseException | None = exc
    while current is not None:
        if isinstance(current, OSError) and current.errno in DEVICE_ERRNOS:
            name = errno.errorcode.get(current.errno or 0, "OSError")
            return f"waiting for storage ({name}); retried with back-off"
        current = current.__cause__ or current.__context__
    return "waiting for storage (unavailable); retried with back-off"
