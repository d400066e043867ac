"""Request ids through a real `ember serve`: the client's ``x-request-id`` comes back on every
answer (the fast path's 200 and 400, FastAPI's 422 and 404, the edge's 401 and 413, the
queue's 429), a new one where the client sent none or an unsafe one, and the server's log
lines about a request carry its id."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support import ServerProcess

SENT = "client-id-0123:abc"


def with_id(request_id: str = SENT) -> dict[str, str]:
    return {"x-request-id": request_id}


@pytest.mark.parametrize(
    ("method", "path", "body", "authorized", "status"),
    [
        ("POST", "/v1/embeddings", {"model": "minilm", "input": "hi"}, True, 200),
        ("POST", "/embed", {"model": "minilm", "inputs": "hi", "dimensions": 9999}, True, 400),
        ("POST", "/v1/embeddings", {"model": "minilm", "input": 3}, True, 422),
        ("POST", "/v1/embeddings", {"model": "minilm", "input": "hi"}, False, 401),
        ("GET", "/no/such/route", None, True, 404),
        ("GET", "/health", None, False, 200),
    ],
)
def test_the_client_id_comes_back(
    server: ServerProcess, method: str, path: str, body: dict | None, authorized: bool, status: int
) -> None:
    headers = {**(server.headers if authorized else {}), **with_id()}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.request(method, path, json=body, headers=headers)
    assert response.status_code == status, response.text
    assert response.headers["x-request-id"] == SENT


def test_over_the_payload_limit_413_carries_it(server: ServerProcess) -> None:
    big = {"model": "minilm", "input": "x" * 250_000}  # --payload-limit 200000
    with server.client() as client:
        response = client.post("/v1/embeddings", json=big, headers=with_id())
    assert response.status_code == 413
    assert response.headers["x-request-id"] == SENT


def test_a_new_id_where_none_or_an_unsafe_one_was_sent(server: ServerProcess) -> None:
    body = {"model": "minilm", "input": "hi"}
    with server.client() as client:
        plain = [client.post("/v1/embeddings", json=body) for _ in range(3)]
        unsafe = client.post("/v1/embeddings", json=body, headers=with_id("has spaces"))
    ids = [r.headers["x-request-id"] for r in [*plain, unsafe]]
    assert all(r.status_code == 200 for r in [*plain, unsafe])
    assert len(set(ids)) == 4 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_refusal_and_its_log_line_carry_the_id(cache_server: ServerProcess) -> None:
    """minilm-b queues two inputs at most: three are more than it can ever take, refused at
    once with 413. The server logs at debug, where uvicorn writes one access line per
    request, made in the request's own task."""
    request_id = f"failing-{time.monotonic_ns()}"
    body = {"model": "minilm-b", "input": ["one 429", "two 429", "three 429"]}
    with cache_server.client() as client:
        response = client.post("/v1/embeddings", json=body, headers=with_id(request_id))
    assert response.status_code == 413, response.text
    assert response.headers["x-request-id"] == request_id
    deadline = time.monotonic() + 10
    lines: list[str] = []
    while not lines and time.monotonic() < deadline:
        lines = [line for line in cache_server.log().splitlines() if request_id in line]
        time.sleep(0.05)
    assert len(lines) == 1, lines
    assert (
        f"[request_id={request_id}]" in lines[0]
        and '"POST /v1/embeddings HTTP/1.1" 413' in (lines[0])
    )
