"""What every platform adapter needs from the core, written once.

Adapters (Modal, BentoML, RunPod, SageMaker) build settings from ``EMBER_*`` env,
start warm engines, and either mount ``create_app`` or dispatch a JSON payload
through the same operations the HTTP routes use. This module and ``ember.engine`` are
what an adapter imports from the core (a test holds them to it).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from ember import tracing
from ember.api.app import EmberApp, create_app
from ember.api.dialects import cohere, dumps, openai
from ember.api.dialects import sagemaker as jsonlines
from ember.api.dialects.sagemaker import JSONLINES
from ember.api.errors import validation_message
from ember.api.middleware import ASGIApp
from ember.api.routes import ROUTES_BY_PATH, ModelRoute
from ember.backends.choice import AUTO, choose_backend, exported_backend
from ember.backends.registry import import_backend
from ember.config import ServerSettings, ember_env, otlp_export, settings_from_env
from ember.engine.array import EngineArray
from ember.engine.loop import EngineLoop
from ember.errors import BadRequest, ConfigError, EmberError, NotFound
from ember.families.resolve import resolve_model
from ember.jobs.fanout import ShardTask, fan_out, join_shards, plan_shards, run_shard
from ember.jobs.inputs import InputSpec
from ember.jobs.runner import JobOptions, embed_rows, job_identity, job_settings, run_embed_job
from ember.logs import REQUEST_ID, configure_logging
from ember.models.spec import ModelSpec, ResolvedModel

__all__ = [
    "ASGIApp",
    "BadRequest",
    "EmberApp",
    "EmberError",
    "EngineLoop",
    "InputSpec",
    "JSONLINES",
    "JobOptions",
    "ModelSpec",
    "ServerSettings",
    "ShardTask",
    "build_engines",
    "concurrency_limits",
    "configure_logging",
    "create_app",
    "dispatch_invocation",
    "dispatch_jsonlines",
    "dispatch_route",
    "ember_env",
    "env_int",
    "exported_backend",
    "fan_out",
    "import_backend",
    "invocation_route",
    "job_identity",
    "job_settings",
    "join_shards",
    "plan_shards",
    "prefetch",
    "preload_runtime",
    "preload_weights",
    "read_pins",
    "run_embed_job",
    "run_shard",
    "settings_from_env",
]


async def build_engines(settings: ServerSettings | None = None) -> EngineArray:
    """Engines for every configured model, loaded and warmed; tracing on where an OTLP
    endpoint is set."""
    settings = settings or settings_from_env()
    tracing.configure(otlp_export(settings))
    engines = EngineArray.from_settings(settings)
    await engines.start()
    return engines


def _parse(route: ModelRoute, payload: Any) -> Any:
    try:
        return route.adapter.validate_python(payload)
    except ValidationError as exc:
        status, message, param = validation_message(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        )
        raise EmberError(message, status_code=status, param=param) from None


def _plain(body: Any) -> Any:
    """Numpy arrays and all -> plain JSON types (adapters hand bodies to other serialisers)."""
    return orjson.loads(dumps(body))


async def dispatch_route(
    engines: EngineArray, path: str, payload: Any, *, max_client_batch_size: int = 2048
) -> Any:
    """Run the operation behind an HTTP path (``/v1/embeddings``, ``/rerank``, ...),
    traced as the HTTP route is (a child of the adapter's own traced request, if any)."""
    if path in ("/v1/models", "/models"):
        return openai.models_list(engines).model_dump(mode="json", exclude_unset=True)
    route = ROUTES_BY_PATH.get(path)
    if route is None:
        known = ", ".join(sorted({*ROUTES_BY_PATH, "/v1/models"}))
        raise NotFound(f"no route {path!r}; known routes: {known}", param="route")
    with tracing.request(path, request_id=REQUEST_ID.get()):
        reply = await route.operation(engines, _parse(route, payload), max_client_batch_size)
        started = time.perf_counter()
        body = _plain(reply.body)
        tracing.stages(reply.timings, (started, time.perf_counter()))
    return body


def invocation_route(engines: EngineArray, payload: Any) -> str:
    """Which route a SageMaker-style body belongs to, told apart by its fields and by
    what the named model (or, unnamed, the served models) can do."""
    if not isinstance(payload, dict):
        raise BadRequest("the body must be a JSON object")
    if "query" in payload:  # TEI's body (texts) on TEI's route; else Cohere's answer
        return "/rerank" if "texts" in payload else "/v1/rerank"
    if "texts" in payload:
        return "/v2/embed"  # Cohere's embed
    if "input" in payload or "inputs" in payload:
        model = payload.get("model")
        caps = engines.capabilities(model if model or len(engines.names) == 1 else None)
        if "classify" in caps and not caps & {"embed", "embed_multi", "embed_sparse"}:
            return "/classify" if "input" in payload else "/predict"
        if "input" in payload:
            return "/v1/embeddings"  # any embedding output: the model's own
        if caps and "embed" not in caps:  # TEI's route for what the model returns
            return "/embed_sparse" if "embed_sparse" in caps else "/embed_all"
        return "/embed"
    raise BadRequest(
        "cannot tell what to do with this body: send OpenAI embeddings {'input'}, "
        "TEI {'inputs'}, Cohere embed {'texts'}, or rerank {'query', 'documents' | 'texts'}"
    )


async def dispatch_invocation(
    engines: EngineArray, payload: Any, *, max_client_batch_size: int = 2048
) -> Any:
    """SageMaker ``/invocations`` semantics: pick the operation by the body's shape."""
    path = invocation_route(engines, payload)
    return await dispatch_route(engines, path, payload, max_client_batch_size=max_client_batch_size)


async def dispatch_jsonlines(
    engines: EngineArray, body: bytes, *, max_client_batch_size: int = 2048
) -> bytes:
    """SageMaker Batch Transform's ``application/jsonlines`` (``SplitType=Line``,
    ``BatchStrategy=MultiRecord``): one output line per input line, in order.

    A line that is one input (a JSON string, or an object with ``text`` and maybe an
    ``id``) is embedded, all of a request's such lines together through the corpus job's
    bounded window (a mini-batch of many MB neither passes the queue limit nor waits
    alone), and answered ``{"id": ..., "embedding": ...}`` (id when given; dense, sparse
    ``{"indices", "values"}`` or multi-vector, as the model returns). A line that is a
    whole request body (OpenAI, Cohere, TEI: rerank rows, say) is answered with what
    ``/invocations`` answers for it.
    """
    records = jsonlines.records(body)
    texts = {i: t for i, r in enumerate(records) if (t := jsonlines.decode(r, i + 1)) is not None}
    answers: list[Any] = [None] * len(records)
    if texts:
        engine = engines.for_task(None, "embed")
        output = engine.family.embedding
        if output is None:
            raise BadRequest(
                f"model {engine.name!r} does not embed: send request bodies, one per line"
            )
        budget = max(1, engine.spec.max_queue_size // 2)  # room left for other callers
        async for _, values in embed_rows(
            engine,
            texts.items(),
            output=output,
            shard_rows=len(texts),
            in_flight=budget,
            chunk_rows=min(64, budget),
        ):
            for index, value in zip(texts, values, strict=True):
                answers[index] = jsonlines.encode(records[index], value)
    bodies = [i for i in range(len(records)) if i not in texts]
    replies = await asyncio.gather(
        *(
            dispatch_invocation(engines, records[i], max_client_batch_size=max_client_batch_size)
            for i in bodies
        )
    )
    for index, reply in zip(bodies, replies, strict=True):
        answers[index] = reply
    return jsonlines.lines(answers)


# Re-exported so adapters can type against them without reaching into submodules.
EmbeddingsRequest = openai.EmbeddingsRequest
RerankRequest = cohere.RerankRequest


def env_int(name: str, default: int | None) -> int | None:
    """An integer platform knob from the environment; empty or unset means the default."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None


def concurrency_limits(settings: ServerSettings, prefix: str) -> tuple[int, int]:
    """(target, max) concurrent requests per replica, sized to the batcher.

    A batch fills from concurrent requests, so a platform should route about one full
    batch of requests (the largest ``max_batch_size``) to each replica (target); bursts
    may reach four batches (max), past which it is better to start another replica than
    to queue behind a busy accelerator. ``<prefix>_TARGET_INPUTS`` / ``<prefix>_MAX_INPUTS``
    override.
    """
    batch = max(spec.max_batch_size for spec in settings.model_specs())
    target = env_int(f"{prefix}_TARGET_INPUTS", None) or batch
    most = env_int(f"{prefix}_MAX_INPUTS", None) or max(target, 4 * batch)
    return target, most


def prefetch(settings: ServerSettings | None = None) -> list[ResolvedModel]:
    """Download (or find) every configured model: image build steps bake weights with it,
    through the same resolution code serving uses."""
    resolved = [resolve_model(spec) for spec in (settings or settings_from_env()).model_specs()]
    for model in resolved:
        print(f"prefetched {model.served_name} ({model.task}) at {model.path}")
    return resolved


def preload_runtime(
    models: Iterable[ResolvedModel], *, accelerator: str | None = None
) -> list[str]:
    """Import the backends ``models`` will load with, and the libraries they run on
    (torch and transformers, onnxruntime, ...), loading no weights; returns their names.

    A memory snapshot taken after this (Modal's ``enter(snap=True)``) holds the imports,
    so restored containers skip them. ``accelerator`` names the device the models will
    be served on where it is not attached yet, for ``--backend auto``'s choice.
    """
    names = sorted(
        {
            model.spec.backend
            if model.spec.backend != AUTO
            else choose_backend(model, accelerator).backend
            for model in models
        }
    )
    for name in names:
        import_backend(name)
    return names


def preload_weights(
    models: Iterable[ResolvedModel], *, accelerator: str | None = None
) -> list[str]:
    """Load the weights of the models torch will serve onto the CPU now, in the dtype of
    the device they will be served on (``accelerator`` where it is not attached yet), and
    return their names. Engines built later take them and only move them to the device:
    a memory snapshot taken in between (Modal's ``enter(snap=True)``) holds the weights."""
    from ember.backends import torch_backend

    names = []
    for model in models:
        backend = model.spec.backend
        if backend == AUTO:
            backend = choose_backend(model, accelerator).backend
        if backend != "torch":
            continue
        device = model.spec.device if model.spec.device != "auto" else accelerator or "cpu"
        # A model's network parts (a Router's routes), each a model of its own (its
        # tables need no torch).
        parts = model.facts.parts or (model,)
        for net in (m for m in parts if not m.family.only_backend):
            torch_backend.preload_weights(net, device)
        names.append(model.served_name)
    return names


def read_pins(section: str, path: Path) -> list[str]:
    """The pins under the ``# <section>`` header of platforms/constraints.txt.

    One file pins every platform's image so a version is bumped in one place; each
    platform installs only its own section. A header is a comment holding one word; the
    section runs to the next header.
    """
    pins: list[str] = []
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if header := re.fullmatch(r"#\s*([A-Za-z0-9_-]+)", line):
            current = header.group(1).lower()
        elif line and not line.startswith("#") and current == section:
            pins.append(line)
    if not pins:
        raise ConfigError(f"no pins under '# {section}' in {path}")
    return pins
