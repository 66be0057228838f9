"""GET /docs and /redoc: Swagger UI and ReDoc served from the files the installed
`fastapi-offline` package ships (no CDN), on the app's own OpenAPI document, with the Bearer
scheme behind Swagger UI's Authorize button."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"

router = APIRouter(include_in_schema=False)


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="Lethe API",
        swagger_js_url="/docs/static/swagger-ui-bundle.js",
        swagger_css_url="/docs/static/swagger-ui.css",
        swagger_favicon_url="/docs/static/favicon.png",
        swagger_ui_parameters={"persistAuthorization": True},
    )


@router.get("/redoc")
def redoc() -> HTMLResponse:
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
