"""A model's load up to what needs the event loop: the model resolved, its backend loaded,
its processor and heads built. Run on a thread (``Engine.begin_load``), so that it can
begin before the server's event loop runs and overlap the server's own start."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from ember.backends.base import Backend
from ember.capabilities import Output
from ember.engine.cache import model_identity
from ember.engine.start_failure import start_failure
from ember.errors import ConfigError, EmberError
from ember.families.resolve import resolve_model
from ember.heads.base import Head
from ember.heads.build import build_heads
from ember.models.spec import ModelSpec, ResolvedModel
from ember.processors import TextProcessor, build_processor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """What ``load_parts`` built, and its seconds."""

    model: ResolvedModel
    backend: Backend
    processor: TextProcessor
    heads: dict[Output, Head]
    identity: str | None  # the embedding cache keys' model part; None without a cache
    seconds: float


def load_parts(
    spec: ModelSpec, backend_loader: Callable[[ResolvedModel], Backend], cached: bool
) -> Loaded:
    """``spec``'s model resolved and loaded with ``backend_loader``; ``cached``: the engine
    answers through the embedding cache (its keys need the model's identity). A failure past
    resolving is one line (``start_failure``); the backend is closed on the way out."""
    started = time.perf_counter()
    model = resolve_model(spec)
    try:
        backend = backend_loader(model)
    except EmberError:
        raise
    except Exception as exc:
        log.debug("loading model %s failed", model.served_name, exc_info=True)
        raise start_failure(model, spec.backend, exc) from exc
    try:
        processor = build_processor(model, backend.max_length)
        if processor.masks_positions and not backend.masked_positions:
            raise ConfigError(
                f"model {model.served_name!r} returns query-expansion positions masked "
                f"from attention, which the {backend.info.name} backend as loaded does not "
                "compute (ct2 takes lengths; flash-attn drops masked positions); serve it "
                "with --backend onnx, or torch without flash-attn"
            )
        heads = build_heads(model)
        identity = model_identity(model, backend.info) if cached else None
    except BaseException as exc:
        backend.close()
        if isinstance(exc, EmberError) or not isinstance(exc, Exception):
            raise
        log.debug("starting model %s failed", model.served_name, exc_info=True)
        raise start_failure(model, backend.info.name, exc) from exc
    return Loaded(model, backend, processor, heads, identity, time.perf_counter() - started)


def close_unused(loading: Future[Loaded]) -> None:
    """A done callback for a load nobody took over: close what it built."""
    if not loading.cancelled() and loading.exception() is None:
        loading.result().backend.close()
