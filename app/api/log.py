"""The log as anyone can read it, with no key: C2SP tlog-tiles under /log/.

`/log/checkpoint` (the newest published checkpoint, a signed note), `/log/vkey` (the log's
verifier key, to pin), `/log/tile/<L>/<N>[.p/<W>]` (hashes) and `/log/tile/entries/<N>[.p/<W>]`
(each certificate body's SHA-256). Tiles never change once served: long cache headers."""

from __future__ import annotations

import threading
from collections import OrderedDict

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from app.api.deps import DbDep, SettingsDep
from app.api.responses import errors
from app.core.errors import APIError
from app.core.ledger import tiles
from app.core.ledger.notes import log_verifier
from app.core.ledger.publish import current_checkpoint
from app.core.ledger.transparency import leaf_count, signing_key

router = APIRouter(prefix="/log", tags=["log"], responses=errors(404, 422, 503))

TEXT = "text/plain; charset=utf-8"
IMMUTABLE = "public, max-age=31536000, immutable"


@router.get("/checkpoint", response_class=Response)
async def checkpoint(db: DbDep, settings: SettingsDep) -> Response:
    """The newest published checkpoint: origin, size, base64 root; the log's signature and
    the witnesses' cosignatures. With no witnesses configured a new head is published here."""

    def newest() -> str | None:
        found = current_checkpoint(db, settings)
        return found.note if found is not None else None

    note = await run_in_threadpool(newest)
    if note is None:
        raise APIError(404, "no_checkpoint", "the log has published no checkpoint yet")
    return Response(note, media_type=TEXT, headers={"Cache-Control": "no-cache"})


@router.get("/vkey", response_class=Response)
def vkey(settings: SettingsDep) -> Response:
    """The log's signed-note verifier key: `<origin>+<key id>+<base64(0x01 ‖ key)>`."""
    verifier = log_verifier(settings.log_origin, signing_key(settings).public_key())
    return Response(verifier.vkey + "\n", media_type=TEXT)


class _FullTiles:
    """Full tiles already served, by database and path: a full tile never changes (it is
    served `immutable`, so every cache on the way keeps it too), so the API keeps the most
    recent ones instead of reading 256 rows again."""

    def __init__(self, entries: int = 2048) -> None:
        self.entries = entries
        self._data: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> bytes | None:
        with self._lock:
            data = self._data.get(key)
            if data is not None:
                self._data.move_to_end(key)
            return data

    def put(self, key: tuple[str, str], data: bytes) -> None:
        with self._lock:
            self._data[key] = data
            while len(self._data) > self.entries:
                self._data.popitem(last=False)


FULL_TILES = _FullTiles()


@router.get("/tile/{path:path}", response_class=Response)
def tile(path: str, db: DbDep) -> Response:
    """A hash tile or an entry bundle, full (256 wide) or partial (`.p/<W>`)."""
    try:
        wanted = tiles.parse_tile_path(path)
    except ValueError as exc:
        raise APIError(404, "no_such_tile", f"not a tile path: {exc}") from exc
    key = (db.url, path)
    cached = FULL_TILES.get(key) if wanted.width is None else None
    if cached is not None:
        return _tile_response(cached)
    with db.read() as session:
        size = leaf_count(session)
        level = wanted.level if wanted.level is not None else 0
        have = tiles.tile_width(size, level, wanted.index)
        width = wanted.width or tiles.WIDTH
        if have < width:
            raise APIError(404, "no_such_tile", f"tile {path} does not exist (yet)")
        if wanted.level is None:
            data = tiles.entry_bundle(session, wanted.index, width)
        else:
            data = tiles.hash_tile(session, wanted.level, wanted.index, width)
    if wanted.width is None:
        FULL_TILES.put(key, data)
    return _tile_response(data)


def _tile_response(data: bytes) -> Response:
    return Response(
        data, media_type="application/octet-stream", headers={"Cache-Control": IMMUTABLE}
    )
