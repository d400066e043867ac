"""OpenTelemetry traces: one span per request, with a child span per stage it went through.

Off unless an OTLP endpoint is set (``ember.config.otlp_export``); off, nothing here imports
OpenTelemetry and each request pays one global read. On, the official SDK exports over
OTLP (gRPC or http/protobuf) through a BatchSpanProcessor, and reads its own ``OTEL_*``
variables: headers, timeout, sampler (``OTEL_TRACES_SAMPLER``), service name, batch schedule.

The stages are recorded after the fact, from the request's ``Timings``: the forward runs on
a worker thread for a batch that mixes requests, so instead of carrying each request's
context through the batcher, the engine measures each request's stages (as it already does
for the timing headers) and the request's span gets them as children with explicit start
and end times. One code path for every caller: the HTTP edge (``ember.api.tracing``), the
platform adapters' dispatch (``ember.platform``) and the corpus job (``ember.jobs``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from ember.engine.result import Timings
from ember.errors import ConfigError, EmberError

log = logging.getLogger(__name__)

T = TypeVar("T")

INSTALL_HINT = "pip install 'ember[otel]'"
# Span names (the README lists them): the request span is named by its route.
SPAN_TOKENIZE = "tokenize"  # tokenising; for images and audio fetching and decoding too
SPAN_QUEUE = "queue"
SPAN_FORWARD = "forward"
SPAN_SERIALIZE = "serialize"
JOB_SPAN = "ember embed"  # one per chunk of rows the corpus job sends to the engine


class Tracer:
    """The SDK's tracer and the W3C trace-context propagator, built once per process."""

    def __init__(self, endpoint: str | None, protocol: str) -> None:
        try:
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )

            if protocol == "grpc":
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                    OTLPSpanExporter,
                )
            else:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )
        except ImportError as exc:
            raise ConfigError(
                f"an OTLP endpoint is set (tracing) but OpenTelemetry is not installed (no "
                f"module {exc.name}, for the {protocol} exporter): {INSTALL_HINT}, or unset "
                "the endpoint"
            ) from None
        if endpoint and protocol != "grpc":  # a base URL, as OTEL_EXPORTER_OTLP_ENDPOINT
            endpoint = endpoint.rstrip("/") + "/v1/traces"
        resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: "ember"}))
        # No sampler given: the SDK reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG
        # (default: parent-based, always on). The provider flushes its spans at exit.
        self.provider = TracerProvider(resource=resource)
        self.exporter = OTLPSpanExporter(endpoint=endpoint)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("ember")
        self.propagator = TraceContextTextMapPropagator()
        self.server_kind, self.internal_kind = SpanKind.SERVER, SpanKind.INTERNAL
        self.error_status = Status(StatusCode.ERROR)
        self.in_context = set_span_in_context
        log.info("tracing: OTLP %s to %s", protocol, endpoint or "the OTEL_* endpoint")


_tracer: Tracer | None = None
# The request being traced in this task (set by ``request``); stages go to its span.
CURRENT: ContextVar[RequestTrace | None] = ContextVar("ember_trace", default=None)


def configure(export: tuple[str | None, str] | None) -> None:
    """Turn tracing on for this process (once; later calls keep the first tracer), given
    ``ember.config.otlp_export(settings)``; None leaves it off and imports nothing."""
    global _tracer
    if export is not None and _tracer is None:
        _tracer = Tracer(*export)


def enabled() -> bool:
    return _tracer is not None


def _epoch_offset_ns() -> int:
    """What to add to ``time.perf_counter()`` nanoseconds for the wall clock's, for span
    times; read once per request, so its stages meet end to start exactly."""
    return time.time_ns() - time.perf_counter_ns()


class RequestTrace:
    """One request's span, started when the request arrives and ended with its status."""

    def __init__(
        self,
        tracer: Tracer,
        name: str,
        route: str,
        *,
        headers: Mapping[str, str] | None,
        request_id: str | None,
        server: bool,
    ) -> None:
        self.tracer = tracer
        outer = CURRENT.get()
        if headers:  # the client's traceparent continues its trace
            parent = tracer.propagator.extract(headers)
        else:  # inside another traced request (an adapter's route dispatching), or a root
            parent = tracer.in_context(outer.span) if outer is not None else None
        attributes: dict[str, Any] = {"ember.route": route}
        if request_id:
            attributes["ember.request_id"] = request_id
        self.span = tracer.tracer.start_span(
            name,
            context=parent,
            kind=tracer.server_kind if server else tracer.internal_kind,
            attributes=attributes,
        )
        self.status: int | None = None

    def stages(self, timings: Timings, serialize: tuple[float, float] | None = None) -> None:
        """The stages ``timings`` measured, as child spans at the times they ran, and the
        serialisation (perf_counter start, end) where there was one."""
        tracer, span = self.tracer, self.span
        context = tracer.in_context(span)
        offset = _epoch_offset_ns()

        def ns(perf: float) -> int:
            return offset + int(perf * 1e9)

        if timings.model:
            span.set_attribute("ember.model", timings.model)
        if timings.started:  # else nothing ran through the engine (a cache hit, /tokenize)
            span.set_attribute("ember.tokens", timings.tokens)
            at = timings.started
            for name, seconds in (
                (SPAN_TOKENIZE, timings.tokenize),
                (SPAN_QUEUE, timings.queue),
                (SPAN_FORWARD, timings.forward),
            ):
                child = tracer.tracer.start_span(name, context=context, start_time=ns(at))
                if name == SPAN_FORWARD:
                    child.set_attribute("ember.batch.size", timings.batch_size)
                    child.set_attribute("ember.batch.tokens", timings.batch_tokens)
                    child.set_attribute("ember.tokens", timings.tokens)
                at += seconds
                child.end(end_time=ns(at))
        if serialize is not None:
            child = tracer.tracer.start_span(
                SPAN_SERIALIZE, context=context, start_time=ns(serialize[0])
            )
            child.end(end_time=ns(serialize[1]))

    def end(self, status: int) -> None:
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(self.tracer.error_status)
        self.span.end()


def status_of(exc: BaseException) -> int:
    """The status an error answers with (``ember.api.errors`` maps the same way)."""
    return exc.status_code if isinstance(exc, EmberError) else 500


@contextmanager
def request(
    name: str,
    route: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    request_id: str | None = None,
    server: bool = False,
) -> Iterator[RequestTrace | None]:
    """Trace the request run inside: its span (None when tracing is off) is the task's
    ``CURRENT`` for ``stages`` to find, and ends with 200, or the status of the error
    that leaves the block (set ``status`` on it to say otherwise)."""
    tracer = _tracer
    if tracer is None:
        yield None
        return
    trace = RequestTrace(
        tracer, name, route or name, headers=headers, request_id=request_id, server=server
    )
    token = CURRENT.set(trace)
    try:
        yield trace
    except BaseException as exc:
        trace.status = trace.status or status_of(exc)
        raise
    finally:
        CURRENT.reset(token)
        trace.end(trace.status or 200)


def stages(timings: Timings, serialize: tuple[float, float] | None = None) -> None:
    """Record ``timings`` (and the serialisation) on the current request's span, if any."""
    trace = CURRENT.get()
    if trace is not None:
        trace.stages(timings, serialize)


def traced(name: str, call: Awaitable[T]) -> Awaitable[T]:
    """``call`` (an engine call returning a ``Result``) as a traced request of its own,
    or ``call`` itself when tracing is off."""
    return call if _tracer is None else _traced(name, call)


async def _traced(name: str, call: Awaitable[Any]) -> Any:
    with request(name):
        result = await call
        stages(result.timings)
        return result
