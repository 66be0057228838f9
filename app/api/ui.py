"""GET /ui: the dashboard, our own static HTML, CSS and JavaScript on the JSON API (no CDN,
no third-party code). The page holds no data: it signs in with an API key kept in the tab's
sessionStorage and reads everything through the API, so each role sees what its key may.

GET /verify (no key): a data subject drops a `.tlog-proof` receipt and the page
checks it in the browser (app/ui/verify.js, WebCrypto) against the log key pinned in the page
and the public log's latest checkpoint and tiles."""

from __future__ import annotations

import html
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.types import Scope

from app.api.deps import SettingsDep
from app.core.ledger.notes import log_verifier
from app.core.ledger.transparency import signing_key

UI = Path(__file__).resolve().parent.parent / "ui"
# Scripts, styles and requests from this origin only; nothing inline, no frames.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"}

router = APIRouter(include_in_schema=False)


@router.get("/ui")
def dashboard() -> FileResponse:
    return FileResponse(UI / "index.html", headers={**HEADERS, "Cache-Control": "no-cache"})


@router.get("/ui/")
def dashboard_slash() -> RedirectResponse:
    return RedirectResponse("/ui")


# Lethe's mark: the river of forgetting, one wave (/favicon.ico was a 404)
FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    '<rect width="32" height="32" rx="6" fill="#1f3b57"/>'
    '<path d="M4 19c4-6 8-6 12 0s8 6 12 0" stroke="#9fd3ff" stroke-width="3" fill="none"/>'
    "</svg>"
)


@router.get("/favicon.ico")
def favicon() -> Response:
    """The dashboard's icon (SVG, which browsers take at this path too)."""
    return Response(
        FAVICON,
        media_type="image/svg+xml",
        headers={**HEADERS, "Cache-Control": "public, max-age=86400"},
    )


@router.get("/verify")
def verify_page(settings: SettingsDep) -> HTMLResponse:
    """The receipt checker, with the log's verifier key pinned in the page (a meta tag: data,
    not script, so the CSP stays as it is)."""
    vkey = log_verifier(settings.log_origin, signing_key(settings).public_key()).vkey
    page = (UI / "verify.html").read_text().replace("{vkey}", html.escape(vkey, quote=True))
    return HTMLResponse(page, headers={**HEADERS, "Cache-Control": "no-cache"})


class _Assets(StaticFiles):
    """The script and stylesheet only, each with the dashboard's headers: the page itself is
    served at /ui alone (/ui/static/index.html served it with no CSP)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        if not path.endswith((".js", ".css")):
            return PlainTextResponse("Not Found", status_code=404, headers=HEADERS)
        response = await super().get_response(path, scope)
        response.headers.update(HEADERS)
        return response


def static_files() -> StaticFiles:
    """The dashboard's script and stylesheet, mounted at /ui/static."""
    return _Assets(directory=UI, html=False)
