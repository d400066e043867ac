"""Media bounded by what it costs, on a real `ember serve` (a tiny CLIP) and a real local
HTTP server: images refused from their header (sides, aspect ratio, JPEG scans, pixels),
decoded within a server-wide pixel budget, downloads held to per-request and server-wide
slots and byte budgets, the request deadline bounding a download, a client that leaves
stopping its downloads, and running out of file descriptors answered 503 and logged.
Each refusal is the OpenAI error shape with the server healthy after."""

from __future__ import annotations

import base64
import io
import os
import re
import resource
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image

from tests.fixtures.media_models import build_tiny_clip
from tests.fixtures.media_server import MediaServer, media_server
from tests.support import ServerProcess, start_server

MAX_REQUEST_FETCHES = 3
MAX_FETCHES = 4
MAX_PIXELS = 4_000_000
BIG_BYTES = 290_000  # under --max-media-bytes 300000; four pass --max-request-media-bytes


def _encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def _uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


SMALL_PNG = _encode(Image.new("RGB", (40, 30), (10, 200, 30)), "PNG")


@pytest.fixture(scope="module")
def files() -> Iterator[MediaServer]:
    served = {
        "/small.png": ("image/png", SMALL_PNG),
        "/big.png": ("image/png", os.urandom(BIG_BYTES)),
    }
    with media_server(served) as httpd:
        yield httpd


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    clip = build_tiny_clip(tmp_path_factory.mktemp("media-limits") / "clip")
    with start_server(
        [
            "--model-id",
            str(clip),
            "--served-model-name",
            "clip",
            "--backend",
            "torch",
            "--allow-private-urls",
            "--max-media-bytes",
            "300000",
            "--max-request-media-bytes",
            "1000000",
            "--max-request-fetches",
            str(MAX_REQUEST_FETCHES),
            "--max-fetches",
            str(MAX_FETCHES),
            "--max-image-pixels",
            str(MAX_PIXELS),
            "--max-decoding-pixels",
            str(MAX_PIXELS),
            "--media-fetch-timeout",
            "30",
            "--request-timeout",
            "3",
        ]
    ) as proc:
        yield proc


def _embed(client: httpx.Client, inputs: list[str]) -> httpx.Response:
    return client.post(
        "/v1/embeddings", json={"model": "clip", "input": inputs, "modality": "image"}
    )


def refused(server: ServerProcess, inputs: list[str], status: int) -> str:
    with server.client() as client:
        response = _embed(client, inputs)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == status
        assert client.get("/health").status_code == 200
    return str(error["message"])


def test_a_tiny_png_of_400000_by_10_is_refused_not_allocated(server: ServerProcess) -> None:
    """Within this server's 4 M pixels (the default 40 M case is in test_media_budget)."""
    data = _encode(Image.new("1", (400_000, 10)), "PNG")
    assert len(data) < 10_000
    message = refused(server, [_uri(SMALL_PNG), _uri(data)], 400)
    assert message.startswith("input 1: image is 400,000 x 10 pixels"), message
    assert "side longer" in message


def test_an_extreme_aspect_ratio_is_refused(server: ServerProcess) -> None:
    data = _encode(Image.new("1", (12_000, 10)), "PNG")  # 120,000 pixels, 1200:1
    assert "aspect ratio over the 50:1" in refused(server, [_uri(data)], 400)


def test_a_jpeg_of_3000_scans_is_refused_before_decoding(server: ServerProcess) -> None:
    jpeg = _encode(Image.new("RGB", (64, 64), (90, 20, 200)), "JPEG", progressive=True)
    first = jpeg.index(b"\xff\xda")
    second = jpeg.index(b"\xff\xda", first + 2)
    repeated = jpeg[:second] + jpeg[first:second] * 3000 + jpeg[second:]
    assert "scans, more than the" in refused(server, [_uri(repeated, "image/jpeg")], 400)


def test_a_34_byte_class_webp_over_the_pixels_is_refused(server: ServerProcess) -> None:
    webp = _encode(Image.new("RGBA", (6000, 6000)), "WEBP", lossless=True)
    assert len(webp) < 2000
    message = refused(server, [_uri(webp, "image/webp")], 400)
    assert "6,000 x 6,000 pixels, more than the 4,000,000" in message


def test_images_at_the_pixel_budget_are_decoded_in_turn(server: ServerProcess) -> None:
    """Three images each the whole --max-decoding-pixels: decoded one at a time, served."""
    webp = _encode(Image.new("RGBA", (2000, 2000), (0, 0, 0, 0)), "WEBP", lossless=True)
    with server.client() as client:
        response = _embed(client, [_uri(webp, "image/webp")] * 3)
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 3


def test_a_requests_media_bytes_are_bounded_in_all(
    server: ServerProcess, files: MediaServer
) -> None:
    """Four downloads of 290,000 bytes pass the request's 1,000,000. They stream at once (three
    slots), so the input whose chunk crosses the total is whichever is read then: any of the
    four (CI once saw input 1, where input 3 is the usual one)."""
    message = refused(server, [f"{files.url}/big.png"] * 4, 413)
    assert re.fullmatch(
        r"input [0-3]: the request's media pass the 1,000,000 bytes accepted in all", message
    ), message


def test_downloads_at_once_per_request_and_server_wide(
    server: ServerProcess, files: MediaServer
) -> None:
    urls = [f"{files.url}/slow/small.png"] * 8
    files.slow.reset()
    with server.client() as client:
        assert _embed(client, urls).status_code == 200
    assert 1 <= files.slow.most <= MAX_REQUEST_FETCHES
    files.slow.reset()
    results: list[int] = []

    def one() -> None:
        with server.client() as client:
            results.append(_embed(client, urls).status_code)

    threads = [threading.Thread(target=one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == [200, 200, 200]
    assert files.slow.started == 24 and files.slow.most <= MAX_FETCHES


def test_the_request_deadline_bounds_a_download(server: ServerProcess, files: MediaServer) -> None:
    """/never answers after 8 s; the fetch timeout is 30 s, the request's 3 s: 504."""
    message = refused(server, [f"{files.url}/never"], 504)
    assert "3s" in message


def test_a_client_that_leaves_stops_its_downloads(
    server: ServerProcess, files: MediaServer
) -> None:
    files.slow.reset()
    urls = [f"{files.url}/slow/small.png"] * 12
    with (
        httpx.Client(base_url=server.url, timeout=0.4) as client,
        pytest.raises(httpx.TimeoutException),
    ):
        _embed(client, urls)  # leaves while the first downloads run
    deadline = time.monotonic() + 10
    while files.slow.now and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # were any still to start, one would have by now
    assert files.slow.started < len(urls), files.slow.started
    with server.client() as client:
        assert client.get("/health").status_code == 200


def test_out_of_file_descriptors_is_a_logged_503(server: ServerProcess, files: MediaServer) -> None:
    """The server's descriptor limit lowered to what it has open: its download cannot get a
    socket. That is the server's 503, logged, not 'input 0: cannot connect'."""
    pid = server.process.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    with server.client() as client:
        assert client.get("/health").status_code == 200  # this connection is open now
        open_fds = {int(name) for name in os.listdir(f"/proc/{pid}/fd")}
        lowest_free = min(set(range(len(open_fds) + 1)) - open_fds)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (lowest_free, hard))
        try:
            response = _embed(client, [f"{files.url}/small.png"])
        finally:
            resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert "file descriptors" in error["message"] and not error["message"].startswith("input")
        assert _embed(client, [f"{files.url}/small.png"]).status_code == 200
    assert "a media download could not connect" in server.log()
