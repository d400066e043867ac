"""Request ids: ``x-request-id`` from the client, or a new one, on every answer and in every
log line about the request.

The outermost ASGI layer, so every answer carries it: the model routes' fast path,
FastAPI's routes and error handlers, the edge's own refusals (401, 413) and CORS
preflights. Answers the connection layer writes itself (``ember.api.connections``: a
stalled request's 408, the 503 past --max-connections) are written before any app runs
and carry none.
"""

from __future__ import annotations

import os
import re

from ember.api.middleware import ASGIApp, Message, Receive, Scope, Send
from ember.logs import REQUEST_ID

HEADER = b"x-request-id"
# What a client's id may be, else a new one replaces it: it is echoed in a response header
# and written into log lines, so no spaces, quotes, control characters or line breaks, and
# short enough that a client cannot grow every log line. UUIDs, ULIDs, hex trace ids and
# AWS's ``Root=1-…`` ids fit.
MAX_LENGTH = 128
_SAFE = re.compile(rb"[A-Za-z0-9._:=+/-]{1,%d}" % MAX_LENGTH)


def new_request_id() -> str:
    """A uuid4 in hex, made as ``uuid.uuid4`` makes one (16 random bytes, the version and
    variant bits set) without its UUID object: 1 µs here where ``uuid4().hex`` took 3."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40
    raw[8] = raw[8] & 0x3F | 0x80
    return raw.hex()


def request_id_for(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's ``x-request-id`` when it is short and of the safe characters, else a
    new one (uuid4 hex)."""
    for name, value in headers:
        if name == HEADER:  # ASGI header names are lower-case
            return value.decode("ascii") if _SAFE.fullmatch(value) else new_request_id()
    return new_request_id()


class RequestIds:
    """Sets the request's id for its task (``ember.logs.REQUEST_ID``, read by the log
    filter) and adds it to the answer's headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_for(scope.get("headers", ()))
        stamp = (HEADER, request_id.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", ()) if h[0].lower() != HEADER]
                message = {**message, "headers": [*headers, stamp]}
            await send(message)

        token = REQUEST_ID.set(request_id)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
