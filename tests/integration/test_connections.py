"""Connection deadlines and limits on a real `ember serve`, driven by raw sockets.

Every wait is bounded: a socket's reads time out, and each loop has a count and a deadline.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from ember.api.connections import (
    ConnectionLimits,
    body_time_left,
    connection_limits,
    head_refusal,
    parser_refusal,
    reserved_refusal,
    slot_for,
    upgrade_refusal,
)
from ember.api.middleware import OPS_PATHS
from ember.config import settings_from_env
from tests.support import ServerProcess, start_server

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
BODY_TOTAL_TIMEOUT = 5.0
MAX_CONNECTIONS = 8
MARGIN = 1.5  # scheduling slack on a loaded 2-core CI machine

EMBED = b'{"input": "The cat sat on the mat."}'
# The default --min-body-rate, in bytes a second: a body must average it after its first
# --body-timeout.
MIN_BODY_RATE = 500
# 2,400 bytes of JSON (padded with whitespace): sent in pieces of 600, one every 0.6 s, it
# averages twice the rate.
LONG_EMBED = EMBED[:-1] + b" " * (2400 - len(EMBED)) + b"}"


@pytest.fixture(scope="module")
def short() -> Iterator[ServerProcess]:
    """Short deadlines, so that each is seen within a second."""
    with start_server(
        [
            "--header-timeout",
            str(HEADER_TIMEOUT),
            "--body-timeout",
            str(BODY_TIMEOUT),
            "--body-total-timeout",
            str(BODY_TOTAL_TIMEOUT),
            "--max-connections",
            str(MAX_CONNECTIONS),
        ]
    ) as server:
        yield server


@pytest.fixture(scope="module")
def held() -> Iterator[ServerProcess]:
    """A small connection cap, and body deadlines long enough that bodies begun and left
    unfinished hold every ordinary slot for the whole test (the default reserve)."""
    with start_server(
        [
            "--max-connections",
            str(MAX_CONNECTIONS),
            "--body-timeout",
            "60",
            "--body-total-timeout",
            "120",
        ]
    ) as server:
        yield server


@pytest.fixture(scope="module")
def capped() -> Iterator[ServerProcess]:
    """A small connection cap and deadlines long enough for idle sockets to hold it."""
    with start_server(
        ["--header-timeout", "60", "--max-connections", str(MAX_CONNECTIONS)]
    ) as server:
        yield server


def _connect(server: ServerProcess, timeout: float = 5.0) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_until_closed(sock: socket.socket, limit: float = 10.0) -> bytes:
    """All the server sends until it closes (a reset counts as closed), within ``limit``."""
    data, deadline = b"", time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return data
        except TimeoutError:
            continue
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"connection still open after {limit}s; got {data[:200]!r}")


def _read_response(sock: socket.socket, limit: float = 30.0) -> tuple[int, bytes]:
    """(status, body) of one Content-Length response, leaving the connection open."""
    data, deadline = b"", time.monotonic() + limit
    while time.monotonic() < deadline:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            if len(body) >= length:
                return int(head.split(b" ", 2)[1]), body[:length]
        chunk = sock.recv(65536)
        assert chunk, f"closed mid-response: {data[:200]!r}"
        data += chunk
    raise AssertionError(f"no whole response within {limit}s: {data[:200]!r}")


def _status(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response.split(b" ", 2)[1])


def _embed_request(body: bytes = EMBED, length: int | None = None) -> bytes:
    return (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length)
    )


def _trickle(sock: socket.socket, pieces: list[bytes], gap: float) -> None:
    """Send ``pieces`` ``gap`` seconds apart, stopping quietly once the server has closed."""
    for piece in pieces:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(piece)
        time.sleep(gap)


# The decisions, alone


def test_head_refusal_counts_headers_and_bytes() -> None:
    limits = ConnectionLimits(max_header_bytes=100, max_headers=3)
    assert head_refusal(b"/", [(b"host", b"x")] * 3, limits) == ""
    assert "more than 3" in head_refusal(b"/", [(b"host", b"x")] * 4, limits)
    assert "over 100 bytes" in head_refusal(b"/" * 90, [(b"host", b"xxxxxxx")], limits)


def test_body_time_left_runs_from_the_last_progress() -> None:
    assert body_time_left(last_progress=10.0, now=10.4, timeout=1.0) == pytest.approx(0.6)
    assert body_time_left(last_progress=10.0, now=11.5, timeout=1.0) < 0
    # progress keeps coming, but the whole body's time is up first
    assert body_time_left(10.9, now=11.0, timeout=1.0, started=8.0, total=3.0) == 0


def test_body_time_left_holds_a_body_to_the_minimum_rate() -> None:
    # a byte every 4 s: never stalls 10 s, but after 10 s it has earned 10.006 s
    assert body_time_left(13.0, now=13.0, timeout=10.0, started=0.0, total=60.0) == 10.0
    cut = body_time_left(13.0, now=13.0, timeout=10.0, started=0.0, total=60.0, received=3,
                         min_rate=500)  # fmt: skip
    assert cut == pytest.approx(10.0 + 3 / 500 - 13.0) and cut < 0
    # 1,000 bytes a second keeps earning more time than passes
    fast = body_time_left(13.0, 13.0, 10.0, started=0.0, total=60.0, received=13_000,
                          min_rate=500)  # fmt: skip
    assert fast == pytest.approx(10.0)  # the stall timer's, not the rate's
    # time the server did not read moves the rate's start (rate_from) on
    assert body_time_left(13.0, 13.0, 10.0, 0.0, 60.0, 3, 500, rate_from=12.0) > 0


def test_limits_must_be_positive() -> None:
    from ember.errors import ConfigError

    with pytest.raises(ConfigError, match="--header-timeout"):
        ConnectionLimits(header_timeout=0)
    with pytest.raises(ConfigError, match="--ops-connections"):
        ConnectionLimits(ops_connections=-1)


def test_a_reserved_slot_is_taken_only_when_every_ordinary_one_is() -> None:
    limits = ConnectionLimits(max_connections=4, ops_connections=2)
    assert slot_for(open_now=3, reserved_open=0, limits=limits) == "ordinary"
    assert slot_for(open_now=4, reserved_open=0, limits=limits) == "reserved"
    assert slot_for(open_now=5, reserved_open=1, limits=limits) == "reserved"
    assert slot_for(open_now=6, reserved_open=2, limits=limits) == ""
    # an ordinary connection closed while reserved ones are open: ordinary again
    assert slot_for(open_now=5, reserved_open=2, limits=limits) == "ordinary"
    assert slot_for(4, 0, ConnectionLimits(max_connections=4, ops_connections=0)) == ""


def test_a_reserved_slot_serves_only_a_bodiless_read_of_an_ops_route() -> None:
    limits = connection_limits(settings_from_env(url_prefix="/v1"), probes=("/ping",))
    host = [(b"host", b"t")]
    for path in (*OPS_PATHS, "/ping", "/v1/health", "/v1/ping"):
        assert reserved_refusal(b"GET", path.encode(), host, limits) == "", path
    assert reserved_refusal(b"HEAD", b"/ready?verbose=1", host, limits) == ""
    refused = [
        (b"POST", b"/v1/embeddings", [*host, (b"content-length", b"9")]),
        (b"GET", b"/v1/models", host),
        (b"GET", b"/docs", host),
        (b"POST", b"/health", host),  # a read only
        (b"GET", b"/health", [*host, (b"content-length", b"5")]),  # a body would hold it
        (b"GET", b"/health", [*host, (b"transfer-encoding", b"chunked")]),
    ]
    for method, url, headers in refused:
        assert "over --max-connections" in reserved_refusal(method, url, headers, limits), url


# Deadlines


def test_idle_sockets_are_closed_by_the_header_timeout(short: ServerProcess) -> None:
    start = time.monotonic()
    socks = [_connect(short) for _ in range(5)]  # under the cap: each is accepted
    try:
        for sock in socks:
            assert _read_until_closed(sock, HEADER_TIMEOUT + MARGIN + 5) == b""  # silent close
        elapsed = time.monotonic() - start
        assert HEADER_TIMEOUT - 0.2 <= elapsed <= HEADER_TIMEOUT + MARGIN, elapsed
    finally:
        for sock in socks:
            sock.close()


def test_slow_headers_are_cut_with_408(short: ServerProcess) -> None:
    with _connect(short) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n")
        # a header a byte every 0.1 s (one byte a second is the attack; this is quicker)
        sock.settimeout(0.1)
        response, deadline = b"", start + HEADER_TIMEOUT + MARGIN + 3
        for _ in range(100):
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b"X")
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                assert time.monotonic() < deadline, "never cut"
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            response += chunk
        elapsed = time.monotonic() - start
    assert _status(response) == 408
    assert b'"code":408' in response and b"connection: close" in response
    assert HEADER_TIMEOUT - 0.2 <= elapsed <= HEADER_TIMEOUT + MARGIN, elapsed


def test_header_timeout_restarts_after_each_response(short: ServerProcess) -> None:
    """On keep-alive the next head is due header-timeout after the previous response."""
    with _connect(short) as sock:
        for _ in range(3):  # spread over more than one header-timeout in all
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n")
            time.sleep(HEADER_TIMEOUT / 2)
            sock.sendall(b"\r\n")
            assert _read_response(sock)[0] == 200
        ended = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # and then nothing more
        response = _read_until_closed(sock, HEADER_TIMEOUT + MARGIN + 5)
        elapsed = time.monotonic() - ended
    assert _status(response) == 408
    assert HEADER_TIMEOUT - 0.2 <= elapsed <= HEADER_TIMEOUT + MARGIN, elapsed


def test_idle_keep_alive_connection_is_closed(short: ServerProcess) -> None:
    with _connect(short) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _read_response(sock)[0] == 200
        ended = time.monotonic()
        assert _read_until_closed(sock, HEADER_TIMEOUT + MARGIN + 5) == b""
        assert time.monotonic() - ended <= HEADER_TIMEOUT + MARGIN


def test_short_body_gets_408(short: ServerProcess) -> None:
    with _connect(short) as sock:
        start = time.monotonic()
        sock.sendall(_embed_request(length=10) + b'{"i')  # 3 of the 10 bytes declared
        response = _read_until_closed(sock, BODY_TIMEOUT + MARGIN + 5)
        elapsed = time.monotonic() - start
    assert _status(response) == 408
    assert b"request body stalled" in response
    assert BODY_TIMEOUT - 0.2 <= elapsed <= BODY_TIMEOUT + MARGIN, elapsed
    # The app saw its body read end; it counts the connection layer's 408, not a 499.
    counted: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any('status="408"' in c for c in counted):
        metrics = httpx.get(short.url + "/metrics", timeout=5).text
        counted = [
            line
            for line in metrics.splitlines()
            if line.startswith('ember_requests_total{route="/v1/embeddings"')
        ]
        time.sleep(0.1)
    assert any('status="408"' in line for line in counted), counted
    assert not any('status="499"' in line for line in counted), counted


def test_slow_body_that_keeps_coming_is_served(short: ServerProcess) -> None:
    """The body deadline is on progress (and the rate), not on the whole body."""
    assert len(LONG_EMBED) == 2400
    pieces = [LONG_EMBED[i : i + 600] for i in range(0, len(LONG_EMBED), 600)]
    gap = BODY_TIMEOUT * 0.6  # the body takes about 2.4 body-timeouts in all
    assert 600 / gap >= 2 * MIN_BODY_RATE
    with _connect(short) as sock:
        sock.sendall(_embed_request(LONG_EMBED))
        _trickle(sock, pieces, gap)
        status, body = _read_response(sock)
    assert status == 200, body
    assert len(pieces) * gap > BODY_TIMEOUT * 2


def test_a_body_under_the_minimum_rate_is_cut_after_the_first_body_timeout(
    short: ServerProcess,
) -> None:
    """A byte every quarter body-timeout never stalls; under --min-body-rate it is cut
    after --body-timeout, not held until --body-total-timeout (the default rate)."""
    import select

    with _connect(short) as sock:
        sock.sendall(_embed_request(length=1000))
        response = b""
        for _ in range(int(4 * BODY_TOTAL_TIMEOUT / (BODY_TIMEOUT / 4))):  # bounded: ~20 s
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b" ")
            readable, _, _ = select.select([sock], [], [], BODY_TIMEOUT / 4)
            if readable:
                response = _read_until_closed(sock)
                break
    assert _status(response) == 408, response[:300]
    assert b"under --min-body-rate 500 bytes/s" in response, response[:300]


def test_a_body_trickled_forever_is_cut_at_the_total_deadline(short: ServerProcess) -> None:
    """600 bytes every half body-timeout never stalls and keeps over the minimum rate,
    but the whole body has --body-total-timeout: 408 then, however long it would go on."""
    import select

    with _connect(short) as sock:
        sock.sendall(_embed_request(length=1_000_000))
        response = b""
        for _ in range(int(4 * BODY_TOTAL_TIMEOUT / (BODY_TIMEOUT / 2))):  # bounded: ~20 s
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                sock.sendall(b" " * 600)
            readable, _, _ = select.select([sock], [], [], BODY_TIMEOUT / 2)
            if readable:
                response = _read_until_closed(sock)
                break
    assert _status(response) == 408, response[:300]
    assert b"not complete within 5s" in response


def test_chunk_trailers_that_never_end_get_431(short: ServerProcess) -> None:
    """Trailers are not body progress: they are bounded like a head, not buffered."""
    with _connect(short) as sock:
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\n[1,2]\r\n0\r\n"
        )
        line = b"X-Trailer: " + b"a" * 1000 + b"\r\n"
        for _ in range(200):  # 200 KB at most, over the 16 KiB a head may take
            try:
                sock.sendall(line)
            except (BrokenPipeError, ConnectionResetError):
                break
        response = _read_until_closed(sock)
    assert _status(response) == 431, response[:300]
    assert b"trailers" in response


# Header limits


@pytest.mark.parametrize(
    "head",
    [
        b"".join(b"X-N%d: v\r\n" % i for i in range(150)),  # too many
        b"X-Big: " + b"a" * 20_000 + b"\r\n",  # too large
    ],
    ids=["count", "size"],
)
def test_oversized_headers_get_431(short: ServerProcess, head: bytes) -> None:
    with _connect(short) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n" + head + b"\r\n")
        response = _read_until_closed(sock)
    assert _status(response) == 431
    assert b'"code":431' in response


def test_a_head_streamed_past_the_limit_is_cut_before_it_ends(short: ServerProcess) -> None:
    """A head arriving in many chunks is refused once it passes the cap, not buffered on."""
    with _connect(short) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: ")
        _trickle(sock, [b"a" * 4096] * 8, gap=0.02)  # 32 KiB, never ended
        response = _read_until_closed(sock, HEADER_TIMEOUT + MARGIN + 5)
    assert _status(response) == 431


def test_ordinary_headers_are_served(short: ServerProcess) -> None:
    head = b"".join(b"X-N%d: %s\r\n" % (i, b"v" * 100) for i in range(50))  # ~5.5 KiB
    with _connect(short) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n" + head + b"\r\n")
        assert _read_response(sock)[0] == 200


# Protocol-level refusals: the OpenAI error shape, not uvicorn's text/plain or empty 403

_UPGRADE = b"Connection: Upgrade\r\nUpgrade: "
_WEBSOCKET = _UPGRADE + b"websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"


def test_parser_and_upgrade_refusals_alone() -> None:
    assert parser_refusal("Pause on PRI/Upgrade")[0] == 505
    assert parser_refusal("Duplicate Content-Length") == (
        400,
        "invalid HTTP request: Duplicate Content-Length",
    )
    ws = [(b"connection", b"keep-alive, Upgrade"), (b"upgrade", b"WebSocket")]
    assert "WebSocket is not served" in upgrade_refusal(ws)
    h2c = [(b"connection", b"Upgrade, HTTP2-Settings"), (b"upgrade", b"h2c")]
    assert upgrade_refusal(h2c) == ""  # served over HTTP/1.1
    assert "Upgrade: h2c is not served" in upgrade_refusal([*h2c, (b"content-length", b"3")])
    assert upgrade_refusal([(b"upgrade", b"websocket")]) == ""  # no Connection: upgrade


@pytest.mark.parametrize(
    ("request_bytes", "status", "fragment"),
    [
        (
            b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            b"Transfer-Encoding can't be present with Content-Length",
        ),
        (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, b"HTTP/2 is not served"),
        (
            b"GET /v1/embeddings HTTP/1.1\r\nHost: t\r\n" + _WEBSOCKET
            + b"Sec-WebSocket-Version: 13\r\n\r\n",
            400,
            b"WebSocket is not served",
        ),
        (  # what the WebSocket library answered in text/plain before Ember saw it
            b"GET /health HTTP/1.1\r\nHost: t\r\n" + _UPGRADE + b"websocket\r\n\r\n",
            400,
            b"WebSocket is not served",
        ),
        (  # the parser stops at the head: the body would be read as empty
            _embed_request().replace(b"\r\n\r\n", b"\r\n" + _UPGRADE + b"h2c\r\n\r\n")
            + EMBED,
            400,
            b"a request body with Upgrade: h2c is not served",
        ),
    ],
    ids=["cl-and-te", "http2-preface", "websocket", "websocket-no-key", "h2c-with-body"],
)  # fmt: skip
def test_protocol_refusals_are_openai_shaped(
    short: ServerProcess, request_bytes: bytes, status: int, fragment: bytes
) -> None:
    with _connect(short) as sock:
        sock.sendall(request_bytes)
        response = _read_until_closed(sock)
    assert _status(response) == status
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)["error"]
    assert error["code"] == status and fragment.decode() in error["message"]
    assert httpx.get(f"{short.url}/health", timeout=10).status_code == 200


MALFORMED = 50
UVICORN_REFUSAL = "Invalid HTTP request received."


def test_a_flood_of_malformed_requests_logs_a_few_lines(short: ServerProcess) -> None:
    """uvicorn logs its own line for each request its parser refuses: rate-limited (one per
    5 s interval, the rest counted into the next), so a client cannot fill the log."""
    before = short.log().count(UVICORN_REFUSAL)
    started = time.monotonic()
    for _ in range(MALFORMED):
        with _connect(short) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            assert _status(_read_until_closed(sock)) == 400
    intervals = 1 + int((time.monotonic() - started) // 5.0)  # the filter's, elapsed
    assert httpx.get(f"{short.url}/health", timeout=10).status_code == 200
    logged = short.log().count(UVICORN_REFUSAL) - before
    # Unlimited, it would be MALFORMED lines; a line of an earlier test may hold the slot.
    assert logged <= intervals < MALFORMED, short.log()[-2000:]


def test_a_bodiless_h2c_upgrade_is_served_over_http1_and_closed(short: ServerProcess) -> None:
    """RFC 9110 §7.8: the Upgrade is ignored; the connection closes after the answer, as
    nothing after an upgrade's head is parsed (a request behind it would hang)."""
    h2c = b"GET /health HTTP/1.1\r\nHost: t\r\n" + _UPGRADE + b"h2c\r\n\r\n"
    with _connect(short) as sock:
        sock.sendall(h2c + b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        response = _read_until_closed(sock)
    assert _status(response) == 200 and response.count(b"HTTP/1.1 ") == 1
    assert b"connection: close" in response.lower()


# Connection cap


def test_connection_cap_refuses_new_connections_and_serves_open_ones(
    capped: ServerProcess,
) -> None:
    keep = _connect(capped)
    fillers: list[socket.socket] = []
    refused: list[socket.socket] = []
    try:
        keep.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _read_response(keep)[0] == 200
        fillers = [_connect(capped) for _ in range(MAX_CONNECTIONS - 1)]
        time.sleep(0.3)  # let the server take them all before the ones past the cap
        refused = [_connect(capped) for _ in range(4)]  # the 9th..12th
        for sock in refused:
            response = _read_until_closed(sock, 5)
            assert response == b"" or _status(response) == 503, response[:200]
            assert response == b"" or b"--max-connections" in response
        # the open connection is still served, a model route included
        keep.sendall(_embed_request() + EMBED)
        status, body = _read_response(keep)
        assert status == 200, body
        keep.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
        assert _read_response(keep)[0] == 200
        # fillers still open: not closed by the cap
        for sock in fillers:
            sock.settimeout(0.05)
            with pytest.raises(TimeoutError):
                sock.recv(1)
        # once connections close, new ones are accepted again
        for sock in fillers:
            sock.close()
        status, deadline = 0, time.monotonic() + 10
        while status != 200 and time.monotonic() < deadline:
            with _connect(capped) as fresh:
                fresh.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
                with contextlib.suppress(AssertionError, ConnectionResetError):
                    status = _read_response(fresh, 5)[0]
            if status != 200:
                time.sleep(0.1)
        assert status == 200
    finally:
        for sock in (keep, *fillers, *refused):
            sock.close()


def _get(path: str) -> bytes:
    return b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n" % path.encode()


def test_ops_routes_answer_while_bodies_hold_every_slot(held: ServerProcess) -> None:
    """Every ordinary slot held by a body begun and never finished (the trickle attack):
    the probes and /metrics are still answered, each on a reserved slot that closes after
    it; a model route arriving on one is refused as any connection past the limit is."""
    fillers: list[socket.socket] = []
    try:
        for _ in range(MAX_CONNECTIONS):
            sock = _connect(held)
            fillers.append(sock)
            sock.sendall(_get("/health"))  # answered: the server holds this slot now
            assert _read_response(sock)[0] == 200
            sock.sendall(_embed_request(length=1000) + b"{")  # 1 of 1,000 body bytes
        for path in ("/health", "/livez", "/ready", "/metrics"):
            with _connect(held) as sock:
                sock.sendall(_get(path))
                response = _read_until_closed(sock)  # one request, then the slot is free
            assert _status(response) == 200, (path, response[:300])
            assert b"connection: close" in response.lower()
        for request in (_embed_request() + EMBED, _get("/v1/models")):
            with _connect(held) as sock:
                sock.sendall(request)
                response = _read_until_closed(sock)
            assert _status(response) == 503, response[:300]
            assert b"over --max-connections" in response
        # the bodies still hold their slots: neither answered nor closed
        for sock in fillers:
            sock.settimeout(0.05)
            with pytest.raises(TimeoutError):
                sock.recv(1)
    finally:
        for sock in fillers:
            sock.close()
