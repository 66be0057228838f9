"""Released weights kept in memory, keyed by their sha256: a download no longer
opens the sealed blob each time. Content addressing makes a stale entry impossible; the route
still reads the version row first, so a purged version is 410 and is dropped from here."""

from __future__ import annotations

import threading
from collections import OrderedDict


class WeightsCache:
    """A byte-bounded LRU of safetensors bytes by sha256."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, sha256: str) -> bytes | None:
        with self._lock:
            data = self._entries.get(sha256)
            if data is not None:
                self._entries.move_to_end(sha256)
            return data

    def put(self, sha256: str, data: bytes) -> None:
        if len(data) > self.max_bytes:
            return
        with self._lock:
            if sha256 in self._entries:
                return
            self._entries[sha256] = data
            self._size += len(data)
            while self._size > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self._size -= len(old)

    def forget(self, sha256: str) -> None:
        with self._lock:
            data = self._entries.pop(sha256, None)
            if data is not None:
                self._size -= len(data)
