"""ASGI edge: API keys and their limits, payload limit and request metrics, before any
routing or parsing.

Pure ASGI (no BaseHTTPMiddleware) so it adds no task or copy per request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import replace
from typing import Any

import orjson

from ember.api.docs import DOCS_PATHS
from ember.api.errors import ember_error_response
from ember.api.keys import ADMIN_PATHS, Key, KeyStore
from ember.callers import CALLER
from ember.errors import EmberError, Forbidden, PayloadTooLarge, error_body
from ember.lanes import HEADER, RULE, LaneRule, parse
from ember.metrics import Metrics

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Paths the API key does not guard, for reading only (GET and HEAD): probes, metrics and
# the docs with their assets. Every other method on them needs the key: ``/`` is also TEI's
# ``POST /`` model route. An adapter that adds a probe of its own declares it
# (``create_app(open_paths=...)``).
OPEN_METHODS = frozenset({"GET", "HEAD"})
HEADER_BYTES = HEADER.encode()  # X-Ember-Priority, as ASGI spells header names
LIVENESS = "/livez"  # Kubernetes' and BentoML's name for the liveness probe
# The operations routes: probes and the metrics scrape, what must answer even when every
# ordinary connection slot is taken (``ember.api.connections``' reserve).
OPS_PATHS = frozenset({"/health", LIVENESS, "/ready", "/metrics"})
OPEN_PATHS = frozenset(
    {
        *OPS_PATHS,
        "/openapi.json",
        "/",
        "/favicon.ico",
        *DOCS_PATHS,
    }
)


WEBSOCKET_REFUSAL = "WebSocket is not served: every route here is plain HTTP/1.1"


async def refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """A WebSocket handed to the app (by a server other than ``ember serve``, whose protocol
    refuses it first): the error shape through the ASGI denial-response extension where the
    server has it, else a close before accepting (the server answers that with a 403)."""
    await receive()  # websocket.connect
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    body = orjson.dumps(error_body(WEBSOCKET_REFUSAL, "invalid_request_error", 400))
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "websocket.http.response.start", "status": 400, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


def route_path(scope: Scope) -> str:
    """The path the app routes on: without the prefix it is mounted under (``root_path``)."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def is_open(method: str, path: str, open_paths: frozenset[str] = OPEN_PATHS) -> bool:
    """Whether a request may pass without the API key: reading an open path, nothing else."""
    return method in OPEN_METHODS and path in open_paths


def _too_large(size: int, limit: int) -> str:
    return f"request body of {size} bytes is over --payload-limit {limit}"


async def read_body(receive: Receive, limit: int | None = None) -> tuple[list[Message], bytes]:
    """Every message of the request body (ending early at a disconnect) and the body bytes;
    past ``limit`` bytes, PayloadTooLarge as soon as that shows."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if limit is not None and size > limit:
            raise PayloadTooLarge(_too_large(size, limit))
        if not message.get("more_body", False):
            break
    return messages, b"".join(m.get("body", b"") for m in messages)


def replay_receive(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that hands out messages already read, then the live ones."""
    pending = iter(messages)

    async def replayed() -> Message:
        return next(pending, None) or await receive()

    return replayed


def lane_rule(scope: Scope, key: Key | None) -> LaneRule:
    """The request's lane rule: its key's (none: the default lane, no ceiling), the
    ``X-Ember-Priority`` header's lane as the default of a body that claims none."""
    rule = LaneRule() if key is None else key.entry.lanes
    for name, value in scope.get("headers", ()):
        if name == HEADER_BYTES:
            return replace(rule, default=parse(value.decode("latin-1"), "X-Ember-Priority"))
    return rule


class EdgeMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        keys: KeyStore | None,
        payload_limit: int,
        metrics: Metrics,
        known_paths: Callable[[], set[str]],
        open_paths: frozenset[str] = OPEN_PATHS,
    ) -> None:
        self.app = app
        self.keys = keys  # None: no key configured, every route open
        self.open_paths = open_paths
        self.payload_limit = payload_limit
        self.metrics = metrics
        self.known_paths = known_paths
        # (route, status) -> its counter and histogram: prometheus' labels() takes a lock
        # and builds a key each call, a few microseconds per request.
        self._series: dict[tuple[str, str], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await refuse_websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = route_path(scope)
        route = path if path in self.known_paths() else "unmatched"
        status_seen = {"status": 500}

        async def send_tracking(message: Message) -> None:
            if message["type"] == "http.response.start":
                status_seen["status"] = message["status"]
            await send(message)

        key: Key | None = None
        admitted = False
        try:
            key = self._key(scope, path)
            if key is not None:
                key.admit(path)
                admitted = True
            receive = await self._limited(scope, receive)
            rule = lane_rule(scope, key)
        except EmberError as exc:
            await ember_error_response(exc)(scope, receive, send_tracking)
        else:
            caller = CALLER.set(key)  # the engine checks the model and reports usage to it
            lanes = RULE.set(rule)  # the route resolves the body's lane claim against it
            try:
                await self.app(scope, receive, send_tracking)
            finally:
                RULE.reset(lanes)
                CALLER.reset(caller)
        finally:
            if key is not None:
                key.finish(status_seen["status"], admitted)
            count, seconds = self._series_for(route, str(status_seen["status"]))
            count.inc()
            seconds.observe(time.perf_counter() - started)

    def _series_for(self, route: str, status: str) -> tuple[Any, Any]:
        series = self._series.get((route, status))
        if series is None:
            series = (
                self.metrics.requests.labels(route, status),
                self.metrics.request_seconds.labels(route, status),
            )
            self._series[(route, status)] = series
        return series

    def _key(self, scope: Scope, path: str) -> Key | None:
        """The request's key (None on an open read, or with no keys configured), or
        Unauthorized. Without any key, the admin routes have no admin to answer."""
        if self.keys is None:
            if path in ADMIN_PATHS:
                raise Forbidden(f"{path} needs an admin key from --api-keys-file")
            return None
        if is_open(scope.get("method", ""), path, self.open_paths):
            return None
        self.keys.poll()
        return self.keys.find(scope.get("headers", ()))

    async def _limited(self, scope: Scope, receive: Receive) -> Receive:
        """Refuse bodies over the limit: by Content-Length, or by counting a chunked body."""
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                declared = int(value) if value.isdigit() else None
        if declared is not None:
            if declared > self.payload_limit:
                raise PayloadTooLarge(_too_large(declared, self.payload_limit))
            return receive
        if scope.get("method") in ("GET", "HEAD"):
            return receive
        chunks, _ = await read_body(receive, self.payload_limit)
        return replay_receive(chunks, receive)


class UrlPrefix:
    """``--url-prefix``: every route also answers under the prefix (Infinity serves its
    routes only there), except where the prefixed path is a route of its own (with
    ``/v1``, ``/v1/embed`` stays Cohere's, not TEI's ``/embed``)."""

    def __init__(self, app: ASGIApp, prefix: str, known_paths: Callable[[], set[str]]) -> None:
        self.app = app
        self.prefix = "/" + prefix.strip("/")
        self.known_paths = known_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = route_path(scope)
            if path.startswith(self.prefix + "/") and path not in self.known_paths():
                rest = path[len(self.prefix) :]
                root = scope.get("root_path", "")
                full = root + rest if scope["path"].startswith(root) else rest
                scope = {**scope, "path": full, "raw_path": full.encode()}
        await self.app(scope, receive, send)
