"""A WebSocket reaching the app (an adapter's server hands it over; `ember serve` refuses it
in its HTTP protocol first) is answered in the OpenAI error shape, not an empty 403."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from ember.api.middleware import WEBSOCKET_REFUSAL, EdgeMiddleware, refuse_websocket
from ember.metrics import Metrics


async def _never(scope: dict, receive: object, send: object) -> None:
    raise AssertionError(f"the app behind the edge saw a {scope['type']} scope")


def test_a_websocket_gets_the_error_shape_through_the_denial_extension() -> None:
    edge = EdgeMiddleware(_never, keys=None, payload_limit=1024, metrics=Metrics(), known_paths=set)
    client = TestClient(edge)  # not entered: no lifespan for the stub behind the edge
    with pytest.raises(WebSocketDenialResponse) as denial, client.websocket_connect("/v1/x"):
        pass
    assert denial.value.status_code == 400
    assert denial.value.json() == {
        "error": {
            "message": WEBSOCKET_REFUSAL,
            "type": "invalid_request_error",
            "param": None,
            "code": 400,
        }
    }


async def test_without_the_extension_it_closes_before_accepting() -> None:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await refuse_websocket({"type": "websocket", "extensions": {}}, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
