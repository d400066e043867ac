"""``/docs`` and ``/redoc`` that work with no network.

FastAPI's own pages load Swagger UI and ReDoc from a CDN (and ReDoc's fonts from Google):
offline, or in a locked-down network, they are blank. Here the pages load the same
bundles from Ember's own routes, out of the ``fastapi-offline`` package (Swagger UI 5,
Apache-2.0; ReDoc 2, MIT), so opening ``/docs`` sends no request off the machine.
Swagger UI's online validator badge is off for the same reason, and the pages carry a
Content-Security-Policy that lets them load from this server only: ReDoc's bundle links
its footer logo from cdn.redoc.ly, which the browser then never asks for.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse

DOCS = "/docs"
REDOC = "/redoc"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
ASSET_ROOT = "/docs/assets"
# The bundles fastapi-offline ships, by the name they are served under, with their type.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
# Same-origin only (inline: the pages' start-up script and the bundles' styles; blob: and
# data: are what ReDoc's search worker and both UIs' icons use).
OFFLINE_POLICY = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; worker-src 'self' blob:; "
    "connect-src 'self'"
)
# What a browser reads to show the docs: open without the API key, as the pages are.
DOCS_PATHS = frozenset({DOCS, REDOC, OAUTH2_REDIRECT, *(f"{ASSET_ROOT}/{name}" for name in ASSETS)})


def _asset_dir() -> Path:
    return Path(str(files("fastapi_offline") / "static"))


def _rooted(request: Request, path: str) -> str:
    """``path`` as the browser must ask for it: under a reverse proxy's root path."""
    return f"{request.scope.get('root_path', '')}{path}"


def _asset(request: Request, name: str) -> str:
    return _rooted(request, f"{ASSET_ROOT}/{name}")


def install_docs(app: FastAPI) -> None:
    """Adds the docs pages and their assets to ``app`` (built with ``docs_url=None`` and
    ``redoc_url=None``, so FastAPI adds no CDN pages of its own)."""
    directory = _asset_dir()
    missing = [name for name in ASSETS if not (directory / name).is_file()]
    if missing:  # a fastapi-offline release that renamed its files: say so at start
        raise RuntimeError(f"fastapi-offline has no {', '.join(missing)} in {directory}")

    schema = app.openapi_url or "/openapi.json"

    @app.get(DOCS, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return _same_origin(
            get_swagger_ui_html(
                openapi_url=_rooted(request, schema),
                title=f"{app.title} - Swagger UI",
                swagger_js_url=_asset(request, "swagger-ui-bundle.js"),
                swagger_css_url=_asset(request, "swagger-ui.css"),
                swagger_favicon_url=_asset(request, "favicon.png"),
                oauth2_redirect_url=_rooted(request, OAUTH2_REDIRECT),
                swagger_ui_parameters={**(app.swagger_ui_parameters or {}), "validatorUrl": None},
            )
        )

    @app.get(OAUTH2_REDIRECT, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return _same_origin(
            get_redoc_html(
                openapi_url=_rooted(request, schema),
                title=f"{app.title} - ReDoc",
                redoc_js_url=_asset(request, "redoc.standalone.js"),
                redoc_favicon_url=_asset(request, "favicon.png"),
                with_google_fonts=False,
            )
        )

    for name, media_type in ASSETS.items():
        _add_asset(app, directory / name, media_type)


def _same_origin(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = OFFLINE_POLICY
    return page


def _add_asset(app: FastAPI, path: Path, media_type: str) -> None:
    async def asset() -> FileResponse:  # ETag and Last-Modified: browsers revalidate
        return FileResponse(path, media_type=media_type)

    app.add_api_route(f"{ASSET_ROOT}/{path.name}", asset, methods=["GET"], include_in_schema=False)
