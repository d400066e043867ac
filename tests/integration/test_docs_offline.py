"""/docs and /redoc work with no network: their assets come from the server itself.

A real headless Chromium (Debian's ``chromium``; ``.ci/run`` installs it where missing)
opens both pages with every host but 127.0.0.1 unresolvable and a dead proxy, and must
find the operations rendered; its network log must show that every request the page made
went to the server.
"""

from __future__ import annotations

import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin

import httpx
import pytest

from ember.api.app import create_app
from ember.config import settings_from_env
from tests.support import ServerProcess, chromium, offline_chromium_argv


class _Links(HTMLParser):
    """Every URL a page's markup loads: src, href, and ReDoc's spec-url."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href", "spec-url") and v]


def _page_urls(html: str) -> list[str]:
    parser = _Links()
    parser.feed(html)
    # Swagger UI's own config names the schema in a script: `url: '/openapi.json'`.
    return parser.urls + re.findall(r"\burl: '([^']+)'", html)


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_pages_load_only_from_this_server(server: ServerProcess, page: str) -> None:
    """No key needed, and every asset the page names is on this host and answers."""
    answer = httpx.get(server.url + page, timeout=30)
    assert answer.status_code == 200 and "text/html" in answer.headers["content-type"]
    urls = _page_urls(answer.text)
    assert len(urls) >= 3, urls  # script, favicon, schema (and Swagger's stylesheet)
    for url in urls:
        assert url.startswith("/") and not url.startswith("//"), url  # same host, no CDN
        asset = httpx.get(urljoin(server.url, url), timeout=30)  # open without the key
        assert asset.status_code == 200 and asset.content, url
    assert "fonts.googleapis" not in answer.text and "cdn." not in answer.text
    # and what the bundles themselves link off-host (ReDoc's footer logo) is never asked for
    assert "default-src 'self'" in answer.headers["content-security-policy"]


@pytest.mark.asyncio
async def test_pages_link_through_a_proxy_root_path(minilm_path: Path) -> None:
    """Behind --proxy-root-path the assets and the schema are linked under it."""
    app = create_app(settings_from_env(model_id=str(minilm_path)))
    transport = httpx.ASGITransport(app=app, root_path="/proxy")  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for page in ("/docs", "/redoc"):
            urls = _page_urls((await client.get(f"/proxy{page}")).text)
            assert urls and all(url.startswith("/proxy/") for url in urls), urls


def _offline_browser(url: str, work: Path) -> tuple[str, list[tuple[str, str]]]:
    """The page's DOM after it rendered, and (initiator, url) of every request made,
    with every host but 127.0.0.1 unresolvable and any proxying sent to a dead port."""
    netlog = work / "netlog.json"
    argv = [
        *offline_chromium_argv(work / "profile"),
        f"--log-net-log={netlog}",
        "--virtual-time-budget=15000",  # virtual: ends once the page is idle
        "--dump-dom",
        url,
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    log = json.loads(netlog.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    requests = [
        (str(e["params"].get("initiator", "")), e["params"]["url"])
        for e in log["events"]
        if e["type"] == start and "url" in e.get("params", {})
    ]
    return done.stdout, requests


@pytest.mark.skipif(chromium() is None, reason="needs chromium: apt-get install -y chromium")
@pytest.mark.parametrize(
    ("page", "rendered"),
    [
        ("/docs", 'class="opblock-summary-path" data-path="/v1/embeddings"'),
        ("/redoc", 'data-section-id="operation/endpoint_v1_embeddings_post"'),
    ],
)
def test_a_browser_renders_the_operations_offline(
    server: ServerProcess, tmp_path: Path, page: str, rendered: str
) -> None:
    dom, requests = _offline_browser(server.url + page, tmp_path)
    assert rendered in dom, dom[-2000:]
    assert "/v1/rerank" in dom  # more than one operation: the whole schema rendered
    # What the page asked for (the browser's own background calls carry no page origin).
    from_page = [url for initiator, url in requests if initiator == server.url]
    assert any(url.endswith("/openapi.json") for url in from_page), requests
    off_host = [url for url in from_page if not url.startswith(server.url + "/")]
    assert off_host == [], off_host
