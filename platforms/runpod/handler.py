"""Ember as a RunPod serverless worker: the core's engines behind RunPod's job queue.

Jobs RunPod hands to this worker (``job["input"]``):

* OpenAI passthrough, which RunPod sends for ``https://api.runpod.ai/v2/<id>/openai/v1/...``:
  ``{"openai_route": "/v1/embeddings" | "/v1/models", "openai_input": {...}}``; the output
  is the OpenAI body itself, so the official OpenAI SDK works against the endpoint.
* Native: ``{"input": [...]}`` (OpenAI embeddings), ``{"query", "documents"}`` (Cohere
  rerank), ``{"inputs"}`` / ``{"query", "texts"}`` (TEI) -- the same bodies, and the same
  answers, as SageMaker's ``/invocations`` (``ember.platform.dispatch_invocation``).

A failed job returns ``{"error": "<message>"}``: RunPod's SDK turns that key into a FAILED
job with that message, instead of a COMPLETED job whose output is an error body.

Why the engines live on their own event-loop thread: RunPod runs the handler on an event
loop it creates *after* this module is imported (``asyncio.run`` in worker mode, uvicorn's
loop under ``--rp_serve_api``), but the models must be loaded and warmed at import so the
first job never pays for it (and FlashBoot snapshots a warm worker). The engines' batcher
tasks belong to the loop that started them, so that loop must outlive import: a daemon
thread runs it, and each job's coroutine is submitted to it and awaited from RunPod's loop.

Configuration is the core's: ``EMBER_*`` env vars (model ids ``;``-separated, backend,
dtype, batch limits...). ``EMBER_RUNPOD_CONCURRENCY`` sets how many jobs one worker takes
at once; by default it is sized to the engines' queue (see ``default_concurrency``).
"""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Sequence
from typing import Any

import runpod

from ember.engine import EngineArray, SyncEngineArray
from ember.platform import (
    BadRequest,
    EmberError,
    ModelSpec,
    configure_logging,
    dispatch_invocation,
    dispatch_route,
    settings_from_env,
)

log = logging.getLogger("ember.runpod")

CONCURRENCY_ENV = "EMBER_RUNPOD_CONCURRENCY"


def default_concurrency(specs: Sequence[ModelSpec]) -> int:
    """Jobs per worker such that a full set of them fits the smallest engine queue.

    A job of up to ``max_batch_size`` texts occupies at most one batch, so
    ``max_queue_size // max_batch_size`` such jobs can wait without the core answering
    429 (which would fail a job RunPod already handed us); more concurrency than that
    only moves queueing from RunPod, where another worker could take the job, into ours.
    """
    sizes = [spec.max_queue_size // max(1, spec.max_batch_size) for spec in specs]
    return max(1, min(sizes, default=1))


def concurrency_from_env(specs: Sequence[ModelSpec]) -> int:
    """``EMBER_RUNPOD_CONCURRENCY`` or the default; checked before any model is loaded."""
    raw = os.environ.get(CONCURRENCY_ENV, "").strip()
    if not raw:
        return default_concurrency(specs)
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"{CONCURRENCY_ENV} must be a positive integer, got {raw!r}")
    return int(raw)


def _error(message: str) -> dict[str, str]:
    return {"error": message}


async def _dispatch(engines: EngineArray, job_input: dict[str, Any], limit: int) -> Any:
    """Route one job's input through the core's dispatchers (HTTP-identical bodies)."""
    if "openai_route" in job_input:
        route = job_input["openai_route"]
        if not isinstance(route, str):
            raise BadRequest("`openai_route` must be a path such as '/v1/embeddings'")
        payload = job_input.get("openai_input") or {}
        return await dispatch_route(engines, route, payload, max_client_batch_size=limit)
    return await dispatch_invocation(engines, job_input, max_client_batch_size=limit)


def make_handler(worker: SyncEngineArray) -> Any:
    """The RunPod handler over started engines.

    A job RunPod stops (cancel, timeout) cancels the awaiting task here, and
    the engine loop carries that cancellation to the engines, so the
    job's texts leave the batch queue instead of being computed for nobody.
    """
    limit = worker.settings.max_client_batch_size

    async def handler(job: dict[str, Any]) -> Any:
        job_input = job.get("input")
        if not isinstance(job_input, dict):
            return _error(
                "job input must be a JSON object: {'input': [...]}, {'query', 'documents'} "
                "or {'openai_route', 'openai_input'}"
            )
        try:
            return await worker.loop.run_async(_dispatch(worker.engines, job_input, limit))
        except EmberError as exc:
            return _error(f"{exc.status_code} {exc.type}: {exc.message}")
        except Exception as exc:  # a job must fail with a message, never crash the worker
            log.exception("job %s failed", job.get("id"))
            return _error(f"500 server_error: {type(exc).__name__}: {exc}")

    return handler


# Built at import: the worker is warm before RunPod hands it the first job.
SETTINGS = settings_from_env()
configure_logging(SETTINGS.log_level, SETTINGS.json_logs)
CONCURRENCY = concurrency_from_env(SETTINGS.model_specs())
# Loads and warms every model on the core's engine loop (a daemon thread); a failure
# raises here, at import, so the worker exits and RunPod reports it.
WORKER = SyncEngineArray(SETTINGS)
atexit.register(WORKER.close)  # after RunPod's loop returns on SIGTERM
handler = make_handler(WORKER)
log.info("ember runpod worker ready: models=%s concurrency=%d", WORKER.engines.names, CONCURRENCY)

if __name__ == "__main__":
    runpod.serverless.start(
        {"handler": handler, "concurrency_modifier": lambda _current: CONCURRENCY}
    )
