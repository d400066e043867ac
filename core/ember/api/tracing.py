"""The HTTP edge's tracing: a span per POST request (every model route, an adapter's
``/invocations``), continuing the client's W3C ``traceparent``, ended with the status the
answer carried. Probes, metrics, docs and other GETs are not traced.

Inside ``ember.api.request_ids`` (the span carries the id) and outside the API key and
payload checks (their refusals are traced too). ``run_operation`` adds the stages
(``ember.tracing.stages``).
"""

from __future__ import annotations

from ember import tracing
from ember.api.middleware import ASGIApp, Message, Receive, Scope, Send, route_path
from ember.logs import REQUEST_ID

TRACE_HEADERS = (b"traceparent", b"tracestate")


class TracedRequests:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not tracing.enabled():
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in TRACE_HEADERS
        }
        with tracing.request(
            f"POST {path}", path, headers=headers, request_id=REQUEST_ID.get(), server=True
        ) as trace:
            assert trace is not None

            async def send_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    trace.status = message["status"]
                await send(message)

            await self.app(scope, receive, send_status)


def traced_requests(app: ASGIApp) -> ASGIApp:
    """``app`` behind the tracing layer when tracing is on; ``app`` itself when off."""
    return TracedRequests(app) if tracing.enabled() else app
