"""The API key guards every route and method but the documented open reads.

Walks the app's whole route table (every path FastAPI knows, every method, with and
without a query string, bare and under ``--url-prefix``): a route added later is walked
too, so it cannot be open by accident.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ember.api.app import create_app
from ember.api.routes import ROUTES
from ember.config import settings_from_env
from ember.engine import EngineArray
from tests.conftest import API_KEY

# SPEC-NOTES (reliability): open without a key, for reading only. Written out here, not
# read from the code, so that widening the code's list fails this test.
DOCUMENTED_OPEN = {
    "/",  # GET only: it redirects to the docs; ``POST /`` is TEI's model route
    "/health",
    "/livez",
    "/ready",
    "/metrics",
    "/docs",
    "/redoc",
    "/openapi.json",
    "/docs/oauth2-redirect",
    # the docs pages' own assets, served by Ember (no CDN)
    "/docs/assets/swagger-ui-bundle.js",
    "/docs/assets/swagger-ui.css",
    "/docs/assets/redoc.standalone.js",
    "/docs/assets/favicon.png",
}
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
KEY = {"Authorization": f"Bearer {API_KEY}"}


def _app(model: Path, **settings: str) -> object:
    """The app with its models not loaded: the edge answers before any engine is asked."""
    config = settings_from_env(model_id=str(model), api_key=API_KEY, **settings)
    return create_app(config, EngineArray(config.model_specs()))


def _paths(app: object) -> set[str]:
    return {route.path for route in app.routes}  # type: ignore[attr-defined]


async def _open_requests(app: object, prefix: str = "", query: str = "") -> set[tuple[str, str]]:
    """Every (method, path) of the route table that answers without the key, and a check
    that each one answers past the edge with it."""
    open_: set[tuple[str, str]] = set()
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path in sorted(_paths(app)):
            url = prefix + path + query
            for method in METHODS:
                body = b"{}" if method not in ("GET", "HEAD") else None
                bare = await client.request(method, url, content=body)
                if bare.status_code != 401:
                    open_.add((method, path))
                else:
                    assert method == "HEAD" or bare.json()["error"]["code"] == 401
                keyed = await client.request(method, url, content=body, headers=KEY)
                assert keyed.status_code != 401, (method, url, keyed.text)
    return open_


def _expected(paths: set[str]) -> set[tuple[str, str]]:
    return {(m, p) for p in paths & DOCUMENTED_OPEN for m in ("GET", "HEAD")}


@pytest.mark.asyncio
@pytest.mark.parametrize("query", ["", "?x=1"])
async def test_only_documented_reads_pass_without_the_key(minilm_path: Path, query: str) -> None:
    app = _app(minilm_path)
    model_paths = {p for route in ROUTES for p in route.paths}
    assert "/" in model_paths and model_paths <= _paths(app)
    assert "/admin/usage" in _paths(app)  # walked too: guarded, and --api-key is no admin
    assert await _open_requests(app, query=query) == _expected(_paths(app))
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        root = await client.get("/")
    assert root.status_code == 307 and root.headers["location"] == "/docs"


@pytest.mark.asyncio
async def test_the_key_guards_every_route_under_a_url_prefix(minilm_path: Path) -> None:
    app = _app(minilm_path, url_prefix="/v1")
    # ``POST /v1/`` reaches TEI's ``POST /``: the key guards it there too.
    assert await _open_requests(app, prefix="/v1") == _expected(_paths(app))


@pytest.mark.asyncio
async def test_the_walk_catches_a_route_opened_by_mistake(minilm_path: Path) -> None:
    """The same walk, on an app whose open list was widened to a model route, sees it."""
    config = settings_from_env(model_id=str(minilm_path), api_key=API_KEY)
    widened = create_app(config, EngineArray(config.model_specs()), open_paths=("/embed",))
    found = await _open_requests(widened)
    assert found - _expected(_paths(widened)) == {("GET", "/embed"), ("HEAD", "/embed")}


def test_a_served_root_post_needs_the_key(server) -> None:
    """As the issue's user tried it: ``ember serve --api-key K`` and a keyless ``POST /``."""
    for url in ("/", "/?x=1"):
        bare = httpx.post(server.url + url, json={"inputs": "hello world"})
        assert bare.status_code == 401, bare.text
        assert bare.json()["error"]["type"] == "authentication_error"
    keyed = httpx.post(
        server.url + "/", json={"model": "minilm", "inputs": "hello world"}, headers=KEY
    )
    assert keyed.status_code == 200, keyed.text
