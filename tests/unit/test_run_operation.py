"""The shared request path under cancellation: a client that left gets 499, a request the
server's graceful shutdown cancels gets 503 in the error shape (not the server's 500)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.datastructures import State

from ember.api.app import run_operation
from ember.metrics import Metrics


def _state() -> State:
    state = State()
    state.engines = None
    state.settings = type("S", (), {"max_client_batch_size": 8})()
    state.metrics = Metrics()
    return state


async def _never_disconnects() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def _slow(engines: Any, body: Any, limit: int) -> Any:
    await asyncio.sleep(30)


async def test_a_request_cancelled_by_shutdown_answers_503() -> None:
    task = asyncio.ensure_future(run_operation(_state(), _never_disconnects, _slow, {}))
    await asyncio.sleep(0.05)
    task.cancel()  # what uvicorn does to requests still running past its graceful timeout
    response = await asyncio.wait_for(task, 5)
    assert response.status_code == 503
    error = orjson.loads(response.body)["error"]
    assert error["code"] == 503 and "shutting down" in error["message"]


async def test_a_client_that_left_gets_499() -> None:
    left = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    task = asyncio.ensure_future(run_operation(_state(), receive, _slow, {}))
    await asyncio.sleep(0.05)
    left.set()
    response = await asyncio.wait_for(task, 5)
    assert response.status_code == 499
