"""The model routes' hot path: raw ASGI in front of FastAPI's router.

Why: FastAPI's middleware stack, routing, dependency solving and JSON-then-validate
parsing cost about 0.7 ms of event-loop CPU per request (measured in-process on
``/v1/embeddings``), which is a fifth of a short sentence's forward pass on a CPU.
Here a well-formed JSON body for a model route is validated in one pydantic-core call
(``validate_json``) and run through the same ``run_operation`` as FastAPI's endpoint.
Anything else — another path or method, a non-JSON content type, a body that does not
validate — goes on to FastAPI unchanged (with the body replayed), so error messages,
/docs and every other route stay FastAPI's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import State

from ember.api.connections import ANSWERED
from ember.api.errors import client_gone_response, exception_response
from ember.api.middleware import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    read_body,
    replay_receive,
    route_path,
)

# (state, receive, operation, parsed body) -> response; ember.api.app.run_operation.
Runner = Callable[[State, Receive, Any, Any], Awaitable[Any]]


class FastRoute(Protocol):
    """What the fast path needs of a route (``ember.api.routes.ModelRoute``)."""

    @property
    def adapter(self) -> TypeAdapter[Any]: ...

    @property
    def operation(self) -> Any: ...


def _json_content(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


class ModelRouteFastPath:
    def __init__(
        self,
        fallback: ASGIApp,
        routes: Mapping[str, FastRoute],
        state: State,
        run: Runner,
    ) -> None:
        """``routes``: every model route by path."""
        self.fallback = fallback
        self.state = state
        self.run = run
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope["type"] == "http" and scope["method"] == "POST" and _json_content(scope):
            route = self.routes.get(route_path(scope))
        if route is None:
            await self.fallback(scope, receive, send)
            return
        messages, body = await read_body(receive)
        if messages[-1]["type"] != "http.request":  # the client left before its body ended
            response = client_gone_response(scope.get(ANSWERED))
            await response(scope, receive, send)  # dropped by the server; counted as 499
            return
        try:
            parsed = route.adapter.validate_json(body)
        except ValidationError:
            # FastAPI words the error exactly as it does for every other route.
            await self.fallback(scope, replay_receive(messages, receive), send)
            return
        try:
            response = await self.run(self.state, receive, route.operation, parsed)
        except Exception as exc:
            response = exception_response(exc)
        await response(scope, receive, send)
