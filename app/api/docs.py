"""GET /docs and /redoc: Swagger UI and ReDoc served from the files the installed
`fastapi-offline` package ships (no CDN), on the app's own OpenAPI document, with the Bearer
scheme behind Swagger UI's Authorize button."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"

router = APIRouter(include_in_schema=False)


# The pages' own inline script is allowed by its hash, nothing else inline runs; styles may be
# inline (both bundles write them); no frame may embed the pages.
POLICY = (
    "default-src 'none'; script-src 'self' {scripts}; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
INLINE_SCRIPT = re.compile(r"<script>(.*?)</script>", re.DOTALL)


def with_policy(page: HTMLResponse) -> HTMLResponse:
    """The page with a Content-Security-Policy that allows its inline scripts by hash."""
    html = bytes(page.body).decode()
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() + "'"
        for body in INLINE_SCRIPT.findall(html)
    )
    page.headers["Content-Security-Policy"] = POLICY.format(scripts=hashes)
    page.headers["X-Content-Type-Options"] = "nosniff"
    return page


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return with_policy(_swagger())


@router.get("/redoc")
def redoc() -> HTMLResponse:
    return with_policy(_redoc())


def _swagger() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="Lethe API",
        swagger_js_url="/docs/static/swagger-ui-bundle.js",
        swagger_css_url="/docs/static/swagger-ui.css",
        swagger_favicon_url="/docs/static/favicon.png",
        swagger_ui_parameters={"persistAuthorization": True},
    )


def _redoc() -> HTMLResponse:
    return get_redoc_html(
        openapi_url="/openapi.json",
        title="Lethe API",
        redoc_js_url="/docs/static/redoc.standalone.js",
        redoc_favicon_url="/docs/static/favicon.png",
        with_google_fonts=False,
    )


def static_files() -> StaticFiles:
    """The documentation pages' scripts and stylesheets, from the package's own folder."""
    return StaticFiles(directory=ASSETS)
