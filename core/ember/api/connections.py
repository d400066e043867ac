"""Connection deadlines and limits, enforced by the HTTP protocol uvicorn runs.

Without them one unauthenticated client can hold every file descriptor: uvicorn has no
timer on a connection that never sends a request, none on headers sent a byte a second,
and none on a body that stops short of its ``Content-Length``. Here, on top of uvicorn's
httptools protocol (its fast parser; kept as the default):

- a request's head must be complete within ``header_timeout`` of the connection opening,
  or of the previous response ending on keep-alive; else 408 (or a silent close when not a
  byte of a next request came: an idle keep-alive connection, a socket that never spoke);
- a body that makes no progress for ``body_timeout`` gets 408 and the connection closes
  (time the server itself stopped reading, for flow control or pipelining, is not counted);
- a body not complete within ``body_total_timeout`` of its head gets 408 too, however it
  trickles: 1,030 connections sending a byte every 4 s held every slot for as long as they
  liked while the stall timer reset at each byte;
- a body arriving slower than ``min_body_rate`` bytes a second gets 408 once that shows:
  it may take ``body_timeout`` plus a second per ``min_body_rate`` bytes received (Apache's
  mod_reqtimeout ``MinRate``), so that same trickle lets go after ``body_timeout``, not
  ``body_total_timeout``;
- a chunked body's framing (chunk-size lines and trailers) may take at most
  ``FRAMING_PER_BODY_BYTE`` bytes per body byte plus ``max_header_bytes``, else 431: a body
  whose trailers never end was otherwise buffered (863 MB, +1.4 GiB RSS) until the stall
  timer, trailers not being body progress;
- idle keep-alive connections close after uvicorn's ``timeout_keep_alive``;
- past ``max_connections`` open at once, a new connection is answered 503 and closed at
  once, while those already open keep being served; except that ``ops_connections`` more
  are kept for the operations routes (``ops_paths``: the probes and ``/metrics``), so
  that a probe is answered while clients hold every ordinary slot. A connection on a
  reserved slot serves one bodiless GET or HEAD of those paths and closes; anything else
  on it (a model route) gets the 503 an ordinary connection past the limit gets, so the
  reserve is no way around ``max_connections``. Its head is due within
  ``OPS_HEAD_TIMEOUT`` (a probe sends its head at once), so idle sockets hold it briefly;
- a head over ``max_header_bytes`` or ``max_headers`` gets 431;
- what the parser refuses (``Content-Length`` with ``Transfer-Encoding``, a malformed
  head) gets 400 and the HTTP/2 connection preface 505, with the parser's reason, where
  uvicorn would answer text/plain; a WebSocket upgrade gets 400 (no route is a WebSocket)
  before uvicorn hands the connection to its WebSocket protocol, whose refusal is an empty
  403; an upgrade request with a body gets 400 (the parser stops at its head, so the body
  would be read as empty). Every answer from this layer is the OpenAI error shape.

Cost per request: a timer armed and cancelled twice (``loop.call_later``), a clock read
per body chunk and two scans of the header names for ``Upgrade`` (under 1 µs each for 10
headers); no per-byte Python work beyond uvicorn's own.
"""

from __future__ import annotations

import logging
import sys
from asyncio import TimerHandle, Transport
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from ember.api.middleware import OPS_PATHS, WEBSOCKET_REFUSAL
from ember.errors import ConfigError, error_body
from ember.logs import RateLimitedLog

if TYPE_CHECKING:
    from ember.config import ServerSettings

log = logging.getLogger(__name__)
# Floods are what these limits exist for: one WARNING line per kind every 5 s.
_warnings: dict[int, RateLimitedLog] = {}

# Real heads are well under 2 KiB and 30 headers; these leave room for large cookies and
# tracing headers while bounding what a client can make the server hold.
MAX_HEADER_BYTES = 16 * 1024
MAX_HEADERS = 100
# A 1-byte chunk is "1\r\nX\r\n": 5 bytes of framing for one of body.
FRAMING_PER_BODY_BYTE = 5
# uvicorn's default, named here: an idle keep-alive connection closes after this.
KEEP_ALIVE_TIMEOUT = 5.0
# Seconds a connection on a reserved (operations) slot may take to send its head: a probe
# or a scrape sends it whole at once; an idle socket should not hold the slot for long.
OPS_HEAD_TIMEOUT = 2.0
# Set in a request's scope when this layer answered it (408) while the app was reading its
# body: the app's read then ends in a disconnect that is not a client leaving (499).
ANSWERED = "ember.connection_answered"

_TYPES = {408: "timeout_error", 431: "invalid_request_error", 503: "service_unavailable"}
# llhttp's reason for pausing on "PRI * HTTP/2.0", the HTTP/2 connection preface.
_HTTP2_PREFACE = "Pause on PRI/Upgrade"


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    body_total_timeout: float = 60.0
    min_body_rate: float = 500.0  # bytes a second; 0: no minimum
    max_connections: int = 1024
    ops_connections: int = 8  # reserved past max_connections for ops_paths; 0: none
    ops_paths: frozenset[str] = OPS_PATHS
    max_header_bytes: int = MAX_HEADER_BYTES
    max_headers: int = MAX_HEADERS

    def __post_init__(self) -> None:
        for name in ("header_timeout", "body_timeout", "body_total_timeout", "max_connections"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{_flag(name)} must be > 0, got {getattr(self, name)}")
        for name in ("min_body_rate", "ops_connections"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{_flag(name)} must be >= 0, got {getattr(self, name)}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def connection_limits(settings: ServerSettings, probes: Iterable[str] = ()) -> ConnectionLimits:
    """The limits ``settings`` ask for. The reserve serves the operations routes, an
    adapter's own ``probes`` (SageMaker's ``/ping``), and each under ``--url-prefix``."""
    paths = {*OPS_PATHS, *probes}
    prefix = (settings.url_prefix or "").strip("/")
    if prefix:
        paths |= {f"/{prefix}{path}" for path in paths}
    return ConnectionLimits(
        header_timeout=settings.header_timeout,
        body_timeout=settings.body_timeout,
        body_total_timeout=settings.body_total_timeout,
        min_body_rate=settings.min_body_rate,
        max_connections=settings.max_connections,
        ops_connections=settings.ops_connections,
        ops_paths=frozenset(paths),
    )


@dataclass
class Reserve:
    """How many connections hold a reserved slot now: one count per server."""

    open: int = 0


def slot_for(open_now: int, reserved_open: int, limits: ConnectionLimits) -> str:
    """Which slot a new connection takes, with ``open_now`` open (``reserved_open`` of them
    on reserved slots): "ordinary", "reserved" (every ordinary slot taken), or "" (none
    left: refused)."""
    if open_now - reserved_open < limits.max_connections:
        return "ordinary"
    return "reserved" if reserved_open < limits.ops_connections else ""


def reserved_refusal(
    method: bytes, url: bytes, headers: Sequence[tuple[bytes, bytes]], limits: ConnectionLimits
) -> str:
    """Why a request on a reserved slot is refused with 503 ('' when it is served): only a
    bodiless GET or HEAD of an operations route is, so that the reserve serves probes and
    the metrics scrape, and no model route gets past ``max_connections`` through it."""
    path = url.split(b"?", 1)[0].split(b"#", 1)[0]
    if (
        method in (b"GET", b"HEAD")
        and path.decode("latin-1") in limits.ops_paths
        and not has_body(headers)
    ):
        return ""
    return (
        f"over --max-connections {limits.max_connections}: the connections past it are "
        f"kept for GET {', '.join(sorted(limits.ops_paths))}"
    )


def head_refusal(
    url: bytes, headers: Sequence[tuple[bytes, bytes]], limits: ConnectionLimits
) -> str:
    """Why a complete request head is refused with 431 ('' when it is not)."""
    if len(headers) > limits.max_headers:
        return f"more than {limits.max_headers} request headers"
    size = len(url) + sum(len(name) + len(value) for name, value in headers)
    if size > limits.max_header_bytes:
        return f"request head over {limits.max_header_bytes} bytes"
    return ""


def parser_refusal(reason: str) -> tuple[int, str]:
    """(status, message) for a request head the HTTP/1.1 parser refused for ``reason``."""
    if reason == _HTTP2_PREFACE:
        return 505, (
            "HTTP/2 is not served (the request began with the HTTP/2 connection preface); "
            "send HTTP/1.1, or put an HTTP/2 proxy in front"
        )
    return 400, f"invalid HTTP request: {reason or 'the HTTP/1.1 parser refused it'}"


def requested_upgrade(headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The protocols a request head asks to switch to (b'' for none; names lower-cased):
    ``Upgrade``, with ``upgrade`` among the ``Connection`` tokens, as the parser reads it."""
    upgrade = [value.strip().lower() for name, value in headers if name == b"upgrade"]
    if not upgrade:  # nearly every request: one pass over the names
        return b""
    connection = {
        token.strip().lower()
        for name, value in headers
        if name == b"connection"
        for token in value.split(b",")
    }
    return b", ".join(upgrade) if b"upgrade" in connection else b""


def has_body(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    """Whether a request head announces a body (a non-zero length, or chunks)."""
    return any(
        (name == b"content-length" and value.strip() != b"0") or name == b"transfer-encoding"
        for name, value in headers
    )


def upgrade_refusal(headers: Sequence[tuple[bytes, bytes]]) -> str:
    """Why a request asking to switch protocols is refused ('' when it is not).

    No route is a WebSocket. The parser stops at an upgrade request's head, so a body
    after it would be lost: such a request is refused rather than read as empty. A
    bodiless one (``Upgrade: h2c`` on a GET) is served over HTTP/1.1 (RFC 9110 §7.8)."""
    upgrade = requested_upgrade(headers)
    if not upgrade:
        return ""
    if b"websocket" in upgrade:
        return WEBSOCKET_REFUSAL
    if has_body(headers):
        return (
            f"a request body with Upgrade: {upgrade.decode('latin-1')} is not served: "
            "send the request without the Upgrade header"
        )
    return ""


def body_time_left(
    last_progress: float,
    now: float,
    timeout: float,
    started: float | None = None,
    total: float = float("inf"),
    received: int = 0,
    min_rate: float = 0.0,
    rate_from: float | None = None,
) -> float:
    """Seconds a body that last made progress at ``last_progress`` may still take: until it
    stalls ``timeout``, or ``total`` after it ``started``, or (``min_rate`` > 0) until its
    ``received`` bytes fall under ``min_rate`` a second after a first ``timeout`` counted
    from ``rate_from`` (default ``started``), whichever comes first."""
    left = last_progress + timeout - now
    if started is not None:
        left = min(left, started + total - now)
        if min_rate > 0:
            origin = started if rate_from is None else rate_from
            left = min(left, origin + timeout + received / min_rate - now)
    return left


def framing_refusal(wire_bytes: int, body_bytes: int, limits: ConnectionLimits) -> str:
    """Why a body's framing is refused with 431 ('' when it is not): ``wire_bytes`` arrived
    while in the body, ``body_bytes`` of them body."""
    if wire_bytes - body_bytes > FRAMING_PER_BODY_BYTE * body_bytes + limits.max_header_bytes:
        return f"chunk framing and trailers over {limits.max_header_bytes} bytes"
    return ""


def error_response(status: int, message: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> bytes:
    """A whole HTTP/1.1 response, OpenAI-shaped like every other error, closing the connection."""
    body = orjson.dumps(error_body(message, _TYPES.get(status, "invalid_request_error"), status))
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n".encode()]
    head += [name + b": " + value + b"\r\n" for name, value in headers]
    head.append(
        b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % len(body)
    )
    return b"".join(head) + body


def _warn(status: int, message: str) -> None:
    _warnings.setdefault(status, RateLimitedLog(log, interval=5.0)).warning(f"{status}: {message}")


try:  # uvicorn[standard] brings httptools; without it uvicorn's h11 runs, without these limits
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - a dependency
    HttpToolsProtocol = None  # type: ignore[assignment,misc]


def http_protocol(limits: ConnectionLimits) -> Any:
    """What ``uvicorn.Config(http=...)`` takes: the protocol class enforcing ``limits``."""
    if HttpToolsProtocol is None:  # pragma: no cover
        log.warning("httptools is not installed: connection deadlines and limits are off")
        return "auto"
    return type("EmberHttpProtocol", (DeadlineProtocol,), {"limits": limits, "reserve": Reserve()})


# Without httptools the class still defines (http_protocol never uses it then): an image
# missing uvicorn[standard]'s extras must start, not fail at import.
_HTTP_BASE: Any = HttpToolsProtocol if HttpToolsProtocol is not None else object


class DeadlineProtocol(_HTTP_BASE):  # type: ignore[misc,valid-type]
    """uvicorn's httptools protocol with the deadlines and limits of ``limits``.

    One timer slot per connection: the head deadline while waiting for a request's head,
    the body deadline while its body arrives, none while the application answers.
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    reserve: ClassVar[Reserve] = Reserve()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: TimerHandle | None = None
        self._reserved = False  # on a slot kept for the operations routes
        self._in_head = False  # a request's first byte came, its head is not complete
        self._messages = 0  # requests begun: tells a chunk that started a new head
        self._head_bytes = 0  # bytes of chunks wholly inside one head (a memory bound)
        self._in_body = False
        self._body_progress = 0.0
        self._body_started = 0.0
        self._rate_from = 0.0  # when the minimum rate's allowance began (reading paused: later)
        self._body_bytes = 0  # body bytes the parser gave
        self._wire_bytes = 0  # bytes received wholly inside the body (framing, trailers too)
        self._done = False  # answered (408/431/503) and closing: parse nothing more

    # Connection lifetime

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        slot = slot_for(len(self.server_state.connections), self.reserve.open, self.limits)
        if not slot:
            self.transport = transport
            self._done = True
            message = f"over --max-connections {self.limits.max_connections}"
            _warn(503, f"connection refused: {message}")
            transport.write(error_response(503, message, self.server_state.default_headers))
            transport.close()
            return
        if slot == "reserved":
            self._reserved = True
            self.reserve.open += 1
        super().connection_made(transport)
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        if self.flow is None:  # refused in connection_made: uvicorn never saw it
            return
        if self._reserved:
            self._reserved = False
            self.reserve.open -= 1
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        messages, continuing, in_body = self._messages, self._in_head, self._in_body
        super().data_received(data)
        # Chunks that arrived inside a body count whole (the one that ended its head, or
        # that began the next request, stays uncounted: one read, a bounded size).
        if in_body and not self._done and messages == self._messages:
            self._wire_bytes += len(data)
            refusal = framing_refusal(self._wire_bytes, self._body_bytes, self.limits)
            if refusal:
                self._answer(431, refusal)
                return
        # A head sent in many chunks is parsed (and buffered) as it comes: bound it here,
        # counting chunks that neither began nor ended it (so never a body's bytes).
        if continuing and self._in_head and messages == self._messages and not self._done:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._answer(431, f"request head over {self.limits.max_header_bytes} bytes")

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer when the parser raises, called while it handles the error: the
        reason is that error's (``sys.exception()``), the answer this layer's shape."""
        error = sys.exc_info()[1]
        status, message = parser_refusal(str(error) if error is not None else "")
        self._answer(status, message)

    def handle_websocket_upgrade(self) -> None:
        if self._done:  # refused in on_headers_complete: the parser still reports it
            return
        self._cancel_deadline()  # the connection is the WebSocket protocol's from here
        self._in_body = False
        super().handle_websocket_upgrade()

    # Parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._messages += 1
        self._head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._done:
            return
        refusal = head_refusal(self.url, self.headers, self.limits)
        if refusal:
            self._answer(431, refusal)
            return
        refusal = upgrade_refusal(self.headers)
        if refusal:
            self._answer(400, refusal)
            return
        if self._reserved:
            refusal = reserved_refusal(
                self.parser.get_method(), self.url, self.headers, self.limits
            )
            if refusal:
                self._answer(503, refusal)
                return
        super().on_headers_complete()
        if (self._reserved or requested_upgrade(self.headers)) and self.cycle is not None:
            # an upgrade: the parser reads nothing after its head; a reserved slot: one
            # request, then the slot is free for the next probe
            self.cycle.keep_alive = False
        self._in_body = True
        self._body_progress = self._body_started = self._rate_from = self.loop.time()
        self._body_bytes = self._wire_bytes = 0
        first = min(self.limits.body_timeout, self.limits.body_total_timeout)
        self._set_deadline(first, self._body_deadline)

    def on_body(self, body: bytes) -> None:
        if self._done:
            return
        self._body_progress = self.loop.time()
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._done:
            return
        if self._in_body:
            self._in_body = False
            self._cancel_deadline()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        waiting = not self.pipeline  # else the next request's head is already here
        super().on_response_complete()
        if waiting and not self.transport.is_closing():
            self._await_head()

    # Deadlines

    def _set_deadline(self, delay: float, callback: Any) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(delay, callback)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_timeout(self) -> float:
        timeout = self.limits.header_timeout
        return min(timeout, OPS_HEAD_TIMEOUT) if self._reserved else timeout

    def _await_head(self) -> None:
        self._in_body = False
        self._set_deadline(self._head_timeout(), self._head_deadline)

    def _head_deadline(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._in_head:
            self._answer(408, f"request head not complete within {self._head_timeout():g}s")
        else:  # not a byte of a request: nobody to answer
            self._done = True
            self.transport.close()

    def _body_deadline(self) -> None:
        self._deadline = None
        if not self._in_body or self.transport.is_closing():
            return
        now = self.loop.time()
        limits = self.limits
        if self.flow.read_paused:  # the server stopped reading, not the client sending
            self._body_progress = now
            if limits.min_body_rate > 0:  # the rate's allowance starts over from here
                earned = self._body_bytes / limits.min_body_rate
                self._rate_from = max(self._rate_from, now - earned)
        left = body_time_left(
            self._body_progress,
            now,
            limits.body_timeout,
            self._body_started,
            limits.body_total_timeout,
            self._body_bytes,
            limits.min_body_rate,
            self._rate_from,
        )
        if left > 0:
            self._deadline = self.loop.call_later(left, self._body_deadline)
            return
        if now - self._body_started >= limits.body_total_timeout:
            self._answer(408, f"request body not complete within {limits.body_total_timeout:g}s")
        elif now - self._body_progress >= limits.body_timeout:
            self._answer(408, f"request body stalled for {limits.body_timeout:g}s")
        else:
            self._answer(
                408,
                f"request body arriving under --min-body-rate {limits.min_body_rate:g} bytes/s "
                f"({self._body_bytes} bytes in {now - self._body_started:.0f}s)",
            )

    def _answer(self, status: int, message: str) -> None:
        """Answer ``status`` (unless a response already began) and close the connection."""
        self._done = True
        self._in_body = False
        self._cancel_deadline()
        _warn(status, message)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.scope[ANSWERED] = status  # type: ignore[index]
            started = cycle.response_started
            # The application's receive() now returns http.disconnect and its sends are
            # dropped: the connection is no longer its to answer.
            cycle.disconnected = True
            cycle.keep_alive = False
            cycle.message_event.set()
            if started:
                self.transport.close()
                return
        self.transport.write(error_response(status, message, self.server_state.default_headers))
        self.transport.close()
