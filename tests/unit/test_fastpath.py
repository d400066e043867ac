"""The model routes' fast path: what it serves itself, and what it hands to FastAPI."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, TypeAdapter
from starlette.datastructures import State
from starlette.responses import Response

from ember.api.fastpath import ModelRouteFastPath
from ember.api.middleware import Message
from ember.errors import BadRequest


class Body(BaseModel):
    input: list[str]


class Recorder:
    """Stands in for FastAPI (records what reached it) and for ``run_operation``."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fallback_bodies: list[bytes] = []
        self.ran: list[Any] = []
        self.fail = fail

    async def fallback(self, scope: dict, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.fallback_bodies.append(body)
        await Response(b"fallback", status_code=299)(scope, receive, send)

    async def run(self, state: State, receive: Any, operation: Any, body: Any) -> Response:
        if self.fail is not None:
            raise self.fail
        self.ran.append((operation, body))
        return Response(orjson.dumps({"got": body.input}), media_type="application/json")


async def call(
    app: ModelRouteFastPath,
    chunks: list[bytes],
    *,
    path: str = "/v1/embeddings",
    method: str = "POST",
    content_type: bytes = b"application/json",
) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "headers": [(b"content-type", content_type)],
    }
    messages: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


def fast_path(recorder: Recorder) -> ModelRouteFastPath:
    route = SimpleNamespace(adapter=TypeAdapter(Body), operation="embed-op")
    routes = {"/v1/embeddings": route, "/embeddings": route}
    return ModelRouteFastPath(recorder.fallback, routes, State(), recorder.run)


async def test_valid_body_is_served_without_fastapi() -> None:
    rec = Recorder()
    status, body = await call(fast_path(rec), [b'{"input": ', b'["a", "b"]}'])  # chunked
    assert status == 200 and orjson.loads(body) == {"got": ["a", "b"]}
    assert rec.ran == [("embed-op", Body(input=["a", "b"]))] and not rec.fallback_bodies


@pytest.mark.parametrize(
    ("chunks", "kwargs"),
    [
        ([b'{"input": "not a list"}'], {}),  # does not validate
        ([b'{"input": ['], {}),  # not JSON
        ([b'{"input": ["a"]}'], {"content_type": b"text/plain"}),
        ([b'{"input": ["a"]}'], {"path": "/v1/other"}),
        ([b""], {"method": "GET"}),
    ],
)
async def test_everything_else_reaches_fastapi_with_its_body(chunks: list, kwargs: dict) -> None:
    rec = Recorder()
    status, _ = await call(fast_path(rec), chunks, **kwargs)
    assert status == 299 and rec.fallback_bodies == [b"".join(chunks)] and not rec.ran


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (BadRequest("too long", param="input"), 400, "invalid_request_error"),
        (RuntimeError("boom"), 500, "server_error"),
    ],
)
async def test_operation_errors_get_the_openai_shape(
    error: Exception, status: int, kind: str
) -> None:
    got_status, body = await call(fast_path(Recorder(fail=error)), [b'{"input": ["a"]}'])
    assert got_status == status and orjson.loads(body)["error"]["type"] == kind


async def test_json_with_charset_is_fast() -> None:
    rec = Recorder()
    ctype = b"application/json; charset=utf-8"
    status, _ = await call(fast_path(rec), [b'{"input": ["a"]}'], content_type=ctype)
    assert status == 200 and rec.ran


async def test_client_gone_before_its_body_ended_is_a_499() -> None:
    rec = Recorder()
    sent: list[Message] = []
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/embeddings",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
    }
    messages: list[Message] = [
        {"type": "http.request", "body": b'{"input": ', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await fast_path(rec)(scope, receive, send)
    assert sent[0]["status"] == 499 and not rec.ran and not rec.fallback_bodies
