"""The FastAPI app: the route table (``ember.api.routes``), one request path, one error
handler."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import Body, FastAPI, Request
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.datastructures import State

import ember
from ember import tracing
from ember.api.dialects import dumps, openai, tei
from ember.api.docs import install_docs
from ember.api.errors import (
    CONNECTION_ERRORS,
    client_gone_response,
    ember_error_response,
    error_response,
    error_responses,
    install_error_handlers,
)
from ember.api.fastpath import ModelRouteFastPath
from ember.api.keys import UsageReport, key_store, reload_on_sighup
from ember.api.middleware import (
    LIVENESS,
    OPEN_PATHS,
    ASGIApp,
    EdgeMiddleware,
    Receive,
    Scope,
    Send,
    UrlPrefix,
    is_open,
)
from ember.api.request_ids import RequestIds
from ember.api.routes import ROUTES, ROUTES_BY_PATH, ModelRoute, Operation
from ember.api.tracing import traced_requests
from ember.config import ServerSettings, otlp_export, settings_from_env
from ember.defaults import DEFAULT_MODEL_NAME
from ember.engine.array import EngineArray
from ember.engine.residency import Slot
from ember.errors import EmberError, Unavailable, error_body
from ember.lanes import HEADER, LANE_NAMES
from ember.lanes import current as current_lane

log = logging.getLogger(__name__)

TIMING_HEADERS: dict[str, Any] = {
    name: {"schema": {"type": "string"}, "description": "Milliseconds."}
    for name in (
        "x-tokenization-time",
        "x-queue-time",
        "x-inference-time",
        "x-serialization-time",
        "x-total-time",
    )
}
# What every model route's answer carries: its timings, the inputs it cut and the lane it
# was served in.
REPLY_HEADERS: dict[str, Any] = {
    **TIMING_HEADERS,
    "x-ember-truncated": {
        "schema": {"type": "string"},
        "description": "Inputs cut to the model's maximum length (0: none): nothing is "
        "truncated without this trace.",
    },
    HEADER: {
        "schema": {"type": "string", "enum": list(LANE_NAMES)},
        "description": "The priority lane the request was served in (docs/operations/lanes.md).",
    },
}


class HealthResponse(BaseModel):
    status: Literal["ok"]
    unix: float = Field(description="The server's clock (Infinity's health answer).")


class HealthNotReady(BaseModel):
    status: Literal["loading", "failed"] = Field(
        description="loading: a model is still loading or warming up; failed: one failed "
        "to load (the log and /ready say why)."
    )


class LiveResponse(BaseModel):
    status: Literal["alive"]


class ReadyResponse(BaseModel):
    status: Literal["ready"]
    models: list[str]


def _freeze_loaded_objects() -> None:
    """Puts everything loading made (modules, models' Python objects, tokenizers) out of the
    cyclic collector's reach, once: under a flood a full collection walked them all and
    stalled the event loop 42 ms (MiniLM on onnx); frozen, it walks only what requests make.
    The server's own process only: the embedded API leaves its caller's heap alone."""
    gc.collect()
    gc.freeze()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


async def _cancel_when_disconnected(receive: Receive, request: asyncio.Task, gone: list) -> None:
    """Cancels ``request`` when its client goes away (the body has been read already):
    cancelling drops its queued inputs."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.append(True)
            request.cancel()
            return


async def run_operation(
    state: State, receive: Receive, operation: Operation, body: Any
) -> Response:
    """The shared request path of every model route (FastAPI's endpoints and the fast path).

    The operation runs in the request's own task, not a new one: admission, tokenising and
    queueing happen in the step that parsed the body, so a full queue answers 429 without
    waiting for the event loop to come round again (under a flood each turn of the loop
    is long). A watcher task, started only once the operation waits, cancels the request
    if its client leaves; a refusal never pays for one."""
    started = time.perf_counter()
    request = asyncio.current_task()
    assert request is not None
    gone: list = []
    watchers: list[asyncio.Task] = []

    def watch() -> None:
        watchers.append(asyncio.ensure_future(_cancel_when_disconnected(receive, request, gone)))

    start_watching = asyncio.get_running_loop().call_soon(watch)
    try:
        reply = await operation(state.engines, body, state.settings.max_client_batch_size)
    except asyncio.CancelledError:
        if hasattr(request, "uncancel"):  # Python 3.11+
            request.uncancel()
        if gone:
            return client_gone_response()
        # Cancelled from outside: the server's graceful shutdown ran out of time. Answer
        # 503 (retry elsewhere) rather than let the server turn the cancellation into a 500.
        return ember_error_response(
            Unavailable("the server is shutting down and did not finish this request; retry")
        )
    finally:
        start_watching.cancel()
        for watcher in watchers:
            watcher.cancel()
    t0 = time.perf_counter()
    content = dumps(reply.body)
    serialize = time.perf_counter() - t0
    state.metrics.stage_seconds.labels("all", "serialize").observe(serialize)
    tracing.stages(reply.timings, (t0, t0 + serialize))
    t = reply.timings
    headers = {
        "x-tokenization-time": _ms(t.tokenize),
        "x-queue-time": _ms(t.queue),
        "x-inference-time": _ms(t.forward),
        "x-serialization-time": _ms(serialize),
        "x-total-time": _ms(time.perf_counter() - started),
        "x-ember-truncated": str(t.truncated),
        HEADER: current_lane().label,  # the lane served (ember.lanes), after the key's ceiling
    }
    return Response(content, media_type="application/json", headers=headers)


def _endpoint(route: ModelRoute) -> Callable[..., Awaitable[Response]]:
    async def endpoint(request: Request, body: Any) -> Response:
        return await run_operation(request.app.state, request.receive, route.operation, body)

    # FastAPI reads the body model from the signature; set it per route.
    endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter(
                "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request
            ),
            inspect.Parameter(
                "body",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=Annotated[route.body, Body()],
            ),
        ]
    )
    return endpoint


class EmberApp(FastAPI):
    """FastAPI behind Ember's own ASGI front: the edge checks (API key, payload limit,
    request metrics), then the model routes' fast path, then FastAPI's full stack."""

    entry: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await (self.entry or super().__call__)(scope, receive, send)

    async def framework(self, scope: Scope, receive: Receive, send: Send) -> None:
        """FastAPI's own handling: middleware, routing, validation, error handlers."""
        await super().__call__(scope, receive, send)

    def load_state(self) -> Literal["ok", "loading", "failed"]:
        """Whether every model is loaded and warmed (ok), still on its way, or failed."""
        if self.state.load_error is not None:
            return "failed"
        return "ok" if self.state.engines.ready else "loading"

    def health(self) -> Response:
        """What ``/health`` answers: readiness as Infinity, TEI and vLLM mean it (they only
        listen once the model is up, so deployments probe ``/health`` before sending
        traffic): 200 ``{"status": "ok", "unix"}`` once every model is loaded and warmed,
        else 503 ``{"status": "loading" | "failed"}``."""
        state = self.load_state()
        if state == "ok":
            return _json(HealthResponse(status="ok", unix=time.time()))
        return _json(HealthNotReady(status=state), 503)

    def readiness(self) -> Response:
        """What ``/ready`` answers: 200 once every model is loaded and warmed, else 503
        naming what still loads or why loading failed. A platform's own probe (SageMaker's
        ``/ping``) answers this too."""
        if self.state.load_error is not None:
            return _load_failed(self.state.load_error)
        engines: EngineArray = self.state.engines
        if not engines.ready:
            pinned = [s.engine for s in engines.residency.slots if s.pinned]
            loading = [
                e.name or e.spec.model_id or DEFAULT_MODEL_NAME for e in pinned if not e.ready
            ]
            return error_response(
                503, error_body(f"loading: {', '.join(loading)}", "service_unavailable", 503)
            )
        return _json(ReadyResponse(status="ready", models=engines.names))


class ModelAction(BaseModel):
    """llama.cpp's ``POST /models/load`` and ``/models/unload`` body."""

    model: str = Field(description="The served model's name.")


class ModelActionResponse(BaseModel):
    success: bool = Field(description="llama.cpp's answer: true once done.")
    model: str
    status: Literal["loaded", "loading", "unloaded", "failed"]


def _model_action(
    act: Callable[[str], Awaitable[Slot]],
) -> Callable[[ModelAction], Awaitable[ModelActionResponse]]:
    """A ``/models/load`` or ``/models/unload`` endpoint: ``act`` on the body's model."""

    async def endpoint(body: ModelAction) -> ModelActionResponse:
        slot = await act(body.model)
        return ModelActionResponse(success=True, model=slot.name, status=slot.status)

    return endpoint


def _refreeze() -> None:
    """After a model unloads at run time: what was frozen goes back to the collector (the
    unloaded model's cycles among it), then what lives, models loaded since included, is
    frozen again."""
    gc.unfreeze()
    _freeze_loaded_objects()


def _json(body: BaseModel, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json")


def create_app(
    settings: ServerSettings | None = None,
    engines: EngineArray | None = None,
    *,
    on_load_failure: Callable[[BaseException], None] | None = None,
    open_paths: Iterable[str] = (),
) -> EmberApp:
    """Build the HTTP app. Models load in the background, so the server listens at once:
    /livez answers 200 from the start, /health and /ready turn 200 once every model is
    loaded and warmed.

    ``open_paths``: paths an adapter adds (a platform's health probe) that, like
    /health and /ready, answer without the API key.
    """
    settings = settings or settings_from_env()
    tracing.configure(otlp_export(settings))
    engines = engines or EngineArray.from_settings(settings)
    engines.residency.settle = _refreeze
    keys = key_store(engines.metrics, settings.api_keys_file, settings.api_key)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.load_error = None
        loader = asyncio.create_task(_load(app))
        unhook = reload_on_sighup(keys) if keys is not None else None
        try:
            yield
        finally:
            if unhook is not None:
                unhook()
            loader.cancel()
            await engines.stop()

    async def _load(app: FastAPI) -> None:
        try:
            if not engines.started:
                await engines.start()
            _freeze_loaded_objects()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            app.state.load_error = exc
            if isinstance(exc, EmberError):  # a refusal that says why: no traceback
                log.error("loading models failed: %s", exc.message)
            else:
                log.exception("loading models failed")
            if on_load_failure is not None:
                on_load_failure(exc)

    app = EmberApp(
        title="Ember",
        version=ember.__version__,
        summary="Embeddings, reranking and classification: OpenAI-, Cohere- and TEI-compatible.",
        lifespan=lifespan,
        responses=error_responses(CONNECTION_ERRORS),  # every route: a route's own win
        docs_url=None,  # install_docs: the same pages, with no CDN
        redoc_url=None,
    )
    install_docs(app)
    app.state.settings = settings
    app.state.engines = engines
    app.state.metrics = engines.metrics
    app.state.load_error = None
    install_error_handlers(app)

    for route in ROUTES:
        for path in route.paths:
            app.add_api_route(
                path,
                _endpoint(route),
                methods=["POST"],
                summary=route.summary,
                tags=[route.tag],
                response_class=Response,  # run_operation's bytes of the operation's model:
                responses={
                    200: {
                        "model": route.answer,
                        "description": "Success",
                        "headers": REPLY_HEADERS,
                    },
                    **error_responses(route.errors),
                },
            )

    guarded = error_responses((401,))  # behind the API key, as every model route
    down = error_responses((503,))
    # The GET routes below are documented by what they return (FastAPI's response model),
    # fields left unset left out, as the model routes' answers leave them.
    answered = {"response_model_exclude_unset": True, "response_description": "Success"}

    @app.get("/v1/models", tags=["OpenAI"], summary="Served models", responses=guarded, **answered)
    @app.get("/models", include_in_schema=False, **answered)
    async def models() -> openai.ModelsResponse:
        return openai.models_list(engines)

    @app.get(
        "/info",
        tags=["TEI"],
        summary="Model and server facts (TEI-compatible)",
        responses=error_responses((401, 403)),  # 403: a key that may use none of the models
        **answered,
    )
    async def info() -> tei.InfoResponse:
        return tei.info(engines, ember.__version__, settings.max_client_batch_size)

    @app.get(
        "/health",
        tags=["Operations"],
        summary="Readiness: 200 once every model is loaded and warm (as on Infinity, TEI, vLLM)",
        response_class=Response,  # app.health's bytes, for /health and platform probes
        responses={
            200: {"model": HealthResponse, "description": "Every model loaded and warm"},
            503: {"model": HealthNotReady, "description": "Loading, or loading failed"},
        },
    )
    async def health() -> Response:
        return app.health()

    @app.get(
        LIVENESS,
        tags=["Operations"],
        summary="Liveness: 200 while the process serves, whatever the models do",
        **answered,
    )
    async def livez() -> LiveResponse:
        return LiveResponse(status="alive")

    @app.get(
        "/ready",
        tags=["Operations"],
        summary="200 once every model is loaded and warm",
        response_class=Response,  # app.readiness's bytes, for /ready and platform probes
        responses={200: {"model": ReadyResponse, "description": "Ready"}, **down},
    )
    async def ready() -> Response:
        return app.readiness()

    @app.get(
        "/metrics",
        tags=["Operations"],
        summary="Prometheus metrics",
        response_class=PlainTextResponse,  # documents text/plain; the exposition format
        responses={200: {"description": "Prometheus text exposition format"}},
    )
    async def metrics() -> Response:
        return Response(generate_latest(engines.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get(
        "/admin/usage",
        tags=["Operations"],
        summary="Usage per API key since start (needs an admin key from --api-keys-file)",
        responses=error_responses((401, 403)),
        **answered,
    )
    async def admin_usage() -> UsageReport:
        return keys.report() if keys is not None else UsageReport(keys={})

    for path, act, summary in (
        ("/models/load", engines.residency.load, "Load a model now"),
        ("/models/unload", engines.residency.unload, "Unload an unpinned model now"),
    ):
        app.add_api_route(
            path,
            _model_action(act),
            methods=["POST"],
            tags=["Operations"],
            summary=f"{summary} (llama.cpp's route; needs an admin key from --api-keys-file)",
            responses=error_responses((400, 401, 403, 422, 503)),
            **answered,
        )

    @app.get(
        "/",
        tags=["Operations"],
        summary="A browser opening the server's address lands on the docs (as on Infinity)",
        status_code=307,
        response_class=RedirectResponse,
        response_description="To /docs",
        responses={307: {"headers": {"Location": {"schema": {"type": "string"}}}}},
    )
    async def root(request: Request) -> RedirectResponse:
        return RedirectResponse(request.scope.get("root_path", "") + "/docs")

    if keys is not None:
        secure_schema(app, OPEN_PATHS | frozenset(open_paths))

    def known_paths() -> set[str]:
        """Route paths for metric labels, re-read when an adapter adds routes later."""
        if len(app.routes) != known["count"]:
            known["paths"] = {getattr(r, "path", "") for r in app.routes}
            known["count"] = len(app.routes)
        return known["paths"]  # type: ignore[return-value]

    known: dict[str, object] = {"count": -1, "paths": set()}
    fast_path = ModelRouteFastPath(
        app.framework,
        ROUTES_BY_PATH,
        app.state,
        run_operation,
    )
    app.entry = EdgeMiddleware(
        fast_path,
        keys=keys,
        payload_limit=settings.payload_limit,
        metrics=engines.metrics,
        known_paths=known_paths,
        open_paths=OPEN_PATHS | frozenset(open_paths),
    )
    if settings.url_prefix and settings.url_prefix.strip("/"):
        app.entry = UrlPrefix(app.entry, settings.url_prefix, known_paths)
    for line in settings.compat_warnings:
        log.warning("%s", line)
    if settings.cors_allow_origin:
        # Outermost: a browser's preflight carries no API key and must be answered.
        from starlette.middleware.cors import CORSMiddleware

        origins = [o.strip() for o in settings.cors_allow_origin.split(",") if o.strip()]
        app.entry = CORSMiddleware(
            app.entry,
            allow_origins=origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
            expose_headers=[
                "x-total-time",
                "x-inference-time",
                "x-queue-time",
                "x-request-id",
                "x-ember-truncated",
                HEADER,
            ],
        )
    app.entry = RequestIds(traced_requests(app.entry))  # outermost: every answer has the id
    return app


BEARER = {"type": "http", "scheme": "bearer", "description": "--api-key or --api-keys-file"}


def secure_schema(app: FastAPI, open_paths: frozenset[str]) -> None:
    """The served schema names the API key on every operation that needs it (all but the
    open reads: probes, docs), so a client, or a fuzzer, knows a 401 is an answer."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            schema.setdefault("components", {})["securitySchemes"] = {"bearer": BEARER}
            for path, operations in schema["paths"].items():
                for method, operation in operations.items():
                    if not is_open(method.upper(), path, open_paths):
                        operation["security"] = [{"bearer": []}]
        return app.openapi_schema  # type: ignore[return-value]  # set by generate()

    app.openapi = openapi  # type: ignore[method-assign]


def _load_failed(exc: BaseException) -> Response:
    message = exc.message if isinstance(exc, EmberError) else f"{type(exc).__name__}: {exc}"
    return error_response(503, error_body(f"model loading failed: {message}", "server_error", 503))
