"""The docs site builds offline with ``mkdocs build --strict``, every page is in its navigation,
and a real headless Chromium finds the navigation and the search working with no network.

The browser (Debian's ``chromium``; ``.ci/run`` installs it where missing) is driven over
the DevTools protocol, with every host but 127.0.0.1 unresolvable and a dead proxy, on the
built site opened from the disk (``file://``: the offline plugin's inlined index, and the
iframe-worker shim vendored in docs/assets, for the search worker) and from a local server on
127.0.0.1. Its network log must show no request leaving the site.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.server
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support import REPO, child_env, chromium, offline_chromium_argv, stop_process

DOCS = REPO / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``mkdocs build --strict`` into a temporary directory: a warning fails it."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=child_env({"NO_MKDOCS_2_WARNING": "1"}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "WARNING" not in done.stderr, done.stderr[-5000:]
    return out


def nav_pages() -> list[str]:
    """Every page mkdocs.yml's navigation names."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, str):
            yield node
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)
        elif isinstance(node, dict):
            for value in node.values():
                yield from walk(value)

    return list(walk(config["nav"]))


def test_every_page_is_in_the_navigation() -> None:
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    listed = nav_pages()
    assert sorted(pages) == sorted(set(listed)), set(pages) ^ set(listed)
    assert len(listed) == len(set(listed))
    for section in ("api/openai.md", "api/tei.md", "deploy/ray.md", "migrating/from-tei.md"):
        assert section in listed


def test_the_built_site_loads_nothing_from_elsewhere(site: Path) -> None:
    """No CDN, no web fonts: every script and stylesheet is a file of the site."""
    pages = list(site.rglob("*.html"))
    assert len(pages) > len(nav_pages())  # and 404.html
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert "fonts.googleapis" not in html and "fonts.gstatic" not in html, page
        for tag in ('<script src="http', '<link rel="stylesheet" href="http', 'src="//'):
            assert tag not in html, (page, tag)
    assert (site / "search" / "search_index.js").is_file()  # the offline plugin's index


def test_generated_reference_pages_hold_the_code_facts(site: Path) -> None:
    """The CLI, environment, metrics and OpenAPI pages were written from the code."""
    from ember.api.app import create_app
    from ember.config import settings_from_env

    schema = create_app(settings_from_env()).openapi()
    openapi_page = (site / "reference" / "openapi.html").read_text(encoding="utf-8")
    for path in schema["paths"]:
        assert f"{path}</code>" in openapi_page, path
    served = json.loads((site / "reference" / "openapi.json").read_text())
    assert served["paths"].keys() == schema["paths"].keys()
    cli = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    assert "--max-batch-tokens" in cli and "usage: ember serve" in cli
    assert "EMBER_MAX_BATCH_TOKENS" in (site / "reference" / "environment.html").read_text()
    assert "ember_queue_depth" in (site / "operations" / "metrics.html").read_text()
    assert (site / "assets" / "repo" / "benchmarks" / "results").is_dir()  # the chart, copied


@contextlib.contextmanager
def serve_directory(root: Path) -> Iterator[str]:
    """The built site over HTTP on 127.0.0.1, until the block ends."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


class Browser:
    """A headless Chromium page over the DevTools protocol (bounded waits throughout)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.next_id = 0
        self.requests: list[str] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        mine = self.next_id
        await self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        for _ in range(10_000):  # events arrive between the answers
            message = json.loads(await asyncio.wait_for(self.ws.recv(), timeout=60))
            if message.get("method") == "Network.requestWillBeSent":
                self.requests.append(message["params"]["request"]["url"])
            if message.get("id") == mine:
                assert "error" not in message, message
                return message["result"]
        raise AssertionError(f"no answer to {method}")

    async def value(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def wait_for(self, expression: str, seconds: float = 60) -> Any:
        """The expression's value once it is truthy; fails after ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = await self.value(expression)
            if found:
                return found
            await asyncio.sleep(0.2)
        raise AssertionError(f"never true within {seconds} s: {expression}")

    async def open(self, url: str) -> None:
        await self.call("Page.navigate", url=url)
        loaded = "document.readyState == 'complete'"
        await self.wait_for(f"location.href === {json.dumps(url)} && {loaded}")


@contextlib.contextmanager
def offline_chromium() -> Iterator[str]:
    """Chromium with its DevTools port open; yields the first page's websocket URL."""
    with tempfile.TemporaryDirectory() as profile:
        argv = [*offline_chromium_argv(Path(profile)), "--remote-debugging-port=0", "about:blank"]
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                port_file.exists() and port_file.read_text().strip()
            ):
                assert process.poll() is None, "chromium exited"
                time.sleep(0.1)
            port = port_file.read_text().split()[0]
            targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            yield next(t for t in targets if t["type"] == "page")["webSocketDebuggerUrl"]
        finally:
            stop_process(process)


NAV_LINKS = "[...document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]')]"
RESULTS = "[...document.querySelectorAll('.md-search-result__item a')].map(a => a.href)"


async def _browse(ws_url: str, base: str) -> tuple[list[str], str, list[str], list[str]]:
    """Open the home page, follow a navigation link, search; what each showed."""
    import websockets

    async with websockets.connect(ws_url, max_size=2**26) as ws:
        page = Browser(ws)
        await page.call("Network.enable")
        await page.call("Runtime.enable")
        await page.open(f"{base}/index.html")
        links = await page.value(f"{NAV_LINKS}.map(a => a.getAttribute('href'))")
        # navigation: click TEI's page in the menu and land on it
        await page.value(f"{NAV_LINKS}.find(a => a.getAttribute('href') == 'api/tei.html').click()")
        await page.wait_for("location.pathname.endsWith('/api/tei.html')")
        title = await page.wait_for("document.title")
        # search: Material reads ?q= and shows its results as you type
        await page.open(f"{base}/index.html?q=truncate_prompt_tokens")
        results = await page.wait_for(f"{RESULTS}.length > 0 && {RESULTS}")
        return links, title, results, page.requests


@contextlib.contextmanager
def site_url(site: Path, how: str) -> Iterator[str]:
    """The built site's root as a browser opens it: from the disk, or from a local server."""
    if how == "file":
        yield site.as_uri()
    else:
        with serve_directory(site) as base:
            yield base


@pytest.mark.skipif(chromium() is None, reason="needs chromium: apt-get install -y chromium")
@pytest.mark.parametrize("how", ["file", "http"])
def test_a_browser_navigates_and_searches_the_site_offline(site: Path, how: str) -> None:
    with site_url(site, how) as base, offline_chromium() as ws_url:
        links, title, results, requests = asyncio.run(_browse(ws_url, base))
    linked = {link.split("#")[0] for link in links}
    for page in nav_pages():  # every page of the navigation is in the home page's menu
        assert page.removesuffix(".md") + ".html" in linked, page
    assert title.startswith("TEI "), title
    assert any("/api/vllm.html" in url for url in results), results
    off_site = [url for url in requests if not url.startswith((base + "/", "data:", "blob:"))]
    assert off_site == [], off_site
    index = "search_index.js" if how == "file" else "search_index.json"
    assert any(url.endswith(f"/search/{index}") for url in requests), requests
