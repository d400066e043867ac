"""Ember as a RunPod serverless worker: the core's engines behind RunPod's job queue.

Jobs RunPod hands to this worker (``job["input"]``):

* OpenAI passthrough, which RunPod sends for ``https://api.runpod.ai/v2/<id>/openai/v1/...``:
  ``{"openai_route": "/v1/embeddings" | "/v1/models", "openai_input": {...}}``; the output
  is the OpenAI body itself, so the official OpenAI SDK works against the endpoint.
* Native: ``{"input": [...]}`` (OpenAI embeddings), ``{"query", "documents"}`` (Cohere
  rerank), ``{"inputs"}`` / ``{"query", "texts"}`` (TEI) -- the same bodies, and the same
  answers, as SageMaker's ``/invocations`` (``ember.platform.dispatch_invocation``). Every
  other field (``model``, ``modality``, ``dimensions``...) reaches the core untouched.
* worker-infinity-embedding's rerank fields, so its users switch without changing
  requests: ``docs`` is read as ``documents`` and ``return_docs`` as ``return_documents``.

A failed job returns ``{"error": "<message>"}``: RunPod's SDK turns that key into a FAILED
job with that message, instead of a COMPLETED job whose output is an error body. Two
failures are the platform's rather than the request's:

* an answer over RunPod's 20 MB job-output limit would show as COMPLETED with no output,
  so it is refused with a message saying how to ask for less;
* a fatal CUDA error (an illegal memory access, a device-side assert) leaves the GPU
  context unusable, so the job fails with ``refresh_worker`` and RunPod replaces the
  worker instead of feeding it jobs that would all fail.

Models: ``EMBER_MODEL_ID`` at run time (the endpoint's environment), so one generic image
serves any model; ids found in RunPod's model cache (an endpoint's "Model" setting puts
them under /runpod-volume/huggingface-cache/hub) load from there without a download, ids
baked into the image (build arg MODEL_ID) from the image, others are downloaded at start.

Concurrency: how many jobs this worker holds at once follows the engines' queue depth
(``Concurrency``): it doubles while every slot is busy and the engines keep up, and halves
once more than two batches wait inside. Jobs the worker does not take stay in RunPod's
queue, which is what RunPod's queue-delay autoscaler watches to start more workers; a
fixed high value (it was 128) hid the backlog inside one worker. ``EMBER_RUNPOD_CONCURRENCY``
fixes the value instead.

Why the engines live on their own event-loop thread: RunPod runs the handler on an event
loop it creates (``asyncio.run`` in worker mode, uvicorn's loop under ``--rp_serve_api``),
but the models must be loaded and warmed before the first job. The engines' batcher tasks
belong to the loop that started them, so that loop must outlive the handler's: a daemon
thread runs it, and each job's coroutine is submitted to it and awaited from RunPod's loop.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import runpod

from ember.engine import EngineArray, SyncEngineArray
from ember.platform import (
    BadRequest,
    EmberError,
    ModelSpec,
    configure_logging,
    dispatch_invocation,
    dispatch_route,
    ember_env,
    settings_from_env,
)

log = logging.getLogger("ember.runpod")

CONCURRENCY_ENV = "EMBER_RUNPOD_CONCURRENCY"
# Where RunPod mounts the models an endpoint caches; tests point EMBER_RUNPOD_MODEL_CACHE
# at a directory of their own.
RUNPOD_MODEL_CACHE = Path("/runpod-volume/huggingface-cache/hub")
MODEL_CACHE_ENV = "EMBER_RUNPOD_MODEL_CACHE"
# RunPod drops a job output past this size: the job reads COMPLETED with no output.
OUTPUT_LIMIT_BYTES = 20 * 1024 * 1024
INFINITY_ALIASES = {"docs": "documents", "return_docs": "return_documents"}
# Errors after which the process's CUDA context is unusable (torch says "CUDA error: ...").
FATAL_CUDA = (
    "cuda error",
    "illegal memory access",
    "device-side assert",
    "unspecified launch failure",
    "cublas_status_execution_failed",
    "cudnn_status_execution_failed",
    "uncorrectable ecc error",
)


# ------------------------------------------------------------------------------- models
def cached_snapshot(cache: Path, model_id: str, revision: str | None = None) -> Path | None:
    """The snapshot directory of ``model_id`` in a Hugging Face hub cache, if it is there.

    The cache's own layout (models--org--name/refs, snapshots/<commit>): the revision's
    ref (``main`` when none is asked), else a snapshot named by the commit asked for, else
    the only snapshot there is.
    """
    repo = cache / f"models--{model_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / (revision or "main")
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    if revision and (snapshots / revision).is_dir():
        return snapshots / revision
    found = [p for p in snapshots.iterdir() if p.is_dir()]
    return found[0] if len(found) == 1 and not revision else None


def model_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """Settings overrides that load ids present in RunPod's model cache from there.

    Served names stay the ids the endpoint was configured with, so clients' ``model``
    fields do not change with where the weights came from.
    """
    cache = Path(env.get(MODEL_CACHE_ENV) or RUNPOD_MODEL_CACHE)
    given = ember_env(env)
    ids = [p.strip() for p in given.get("model_id", "").split(";") if p.strip()]
    if not ids or not cache.is_dir():
        return {}
    revisions = [p.strip() for p in given.get("revision", "").split(";")]
    paths: list[str] = []
    for i, model_id in enumerate(ids):
        revision = revisions[i] if i < len(revisions) and revisions[i] else None
        snapshot = cached_snapshot(cache, model_id, revision)
        if snapshot is not None:
            log.info("model %s from RunPod's model cache: %s", model_id, snapshot)
        paths.append(str(snapshot) if snapshot is not None else model_id)
    if paths == ids:
        return {}
    overrides: dict[str, Any] = {"model_id": ";".join(paths)}
    if "served_model_name" not in given:
        overrides["served_model_name"] = ";".join(ids)
    return overrides


# --------------------------------------------------------------------------- concurrency
def queue_fit(specs: Sequence[ModelSpec]) -> int:
    """Jobs of up to one batch each that fit the smallest engine queue without a 429: the
    most this worker ever holds."""
    sizes = [spec.max_queue_size // max(1, spec.max_batch_size) for spec in specs]
    return max(1, min(sizes, default=1))


def next_concurrency(current: int, in_flight: int, backlog_batches: float, ceiling: int) -> int:
    """The next concurrency, from the jobs held and the batches waiting in the engines.

    Halve when more than two batches wait (the engines are behind: leave jobs in RunPod's
    queue, where the autoscaler sees them); double when every slot is taken and less than
    one batch waits (the engines could batch more); else keep. Doubling and halving keep
    the changes few: RunPod's SDK drains the worker's jobs before it resizes.
    """
    if backlog_batches > 2:
        return max(1, current // 2)
    if in_flight >= current and backlog_batches < 1:
        return min(ceiling, current * 2)
    return current


class Concurrency:
    """RunPod's ``concurrency_modifier``, fed by the jobs in flight and the engine queues."""

    def __init__(self, engines: EngineArray, ceiling: int, fixed: int | None = None) -> None:
        self.engines = engines
        self.ceiling = ceiling
        self.fixed = fixed
        self.in_flight = 0
        self.lock = threading.Lock()
        self.asked = False

    @property
    def initial(self) -> int:
        return self.fixed or min(self.ceiling, 4)

    def backlog_batches(self) -> float:
        """Inputs waiting in the busiest engine, in batches of that engine."""
        worst = 0.0
        for engine in self.engines:
            batcher = engine.batcher
            if batcher is not None:
                worst = max(worst, batcher.depth / max(1, batcher.max_batch_size))
        return worst

    def __call__(self, current: int) -> int:
        if self.fixed:
            return self.fixed
        if not self.asked:  # RunPod's JobScaler starts from 1
            self.asked = True
            return self.initial
        return next_concurrency(current, self.in_flight, self.backlog_batches(), self.ceiling)

    def __enter__(self) -> None:
        with self.lock:
            self.in_flight += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.in_flight -= 1


def concurrency_from_env(env: Mapping[str, str]) -> int | None:
    """``EMBER_RUNPOD_CONCURRENCY`` (a fixed value) or None; checked before any model is
    loaded."""
    raw = env.get(CONCURRENCY_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise SystemExit(f"{CONCURRENCY_ENV} must be a positive integer, got {raw!r}")
    return int(raw)


# ------------------------------------------------------------------------------- jobs
def _error(message: str, *, refresh: bool = False) -> dict[str, Any]:
    return {"error": message, "refresh_worker": True} if refresh else {"error": message}


def infinity_compatible(job_input: dict[str, Any]) -> dict[str, Any]:
    """worker-infinity-embedding's rerank field names read as Ember's; everything else
    (``modality`` included) is passed on as sent."""
    if not any(k in job_input for k in INFINITY_ALIASES):
        return job_input
    body = dict(job_input)
    for theirs, ours in INFINITY_ALIASES.items():
        if theirs in body:
            if ours in body:
                raise BadRequest(f"send `{ours}` or `{theirs}`, not both")
            body[ours] = body.pop(theirs)
    return body


def oversized(output: Any) -> str | None:
    """Why ``output`` cannot be returned through RunPod, or None when it fits."""
    size = len(orjson.dumps(output, option=orjson.OPT_SERIALIZE_NUMPY))
    if size <= OUTPUT_LIMIT_BYTES:
        return None
    return (
        f"413 payload_too_large: the answer is {size / 2**20:.1f} MB, over RunPod's "
        f"{OUTPUT_LIMIT_BYTES // 2**20} MB job-output limit; send fewer inputs per job, or ask "
        "for smaller answers (`dimensions`, `encoding_format: base64`, no `return_documents`)"
    )


def fatal_cuda(exc: BaseException) -> bool:
    """True for errors that leave this process's CUDA context broken."""
    text = f"{type(exc).__name__}: {exc}".lower()
    return "outofmemory" not in text and any(marker in text for marker in FATAL_CUDA)


async def _dispatch(engines: EngineArray, job_input: dict[str, Any], limit: int) -> Any:
    """Route one job's input through the core's dispatchers (HTTP-identical bodies)."""
    if "openai_route" in job_input:
        route = job_input["openai_route"]
        if not isinstance(route, str):
            raise BadRequest("`openai_route` must be a path such as '/v1/embeddings'")
        payload = job_input.get("openai_input") or {}
        return await dispatch_route(engines, route, payload, max_client_batch_size=limit)
    body = infinity_compatible(job_input)
    return await dispatch_invocation(engines, body, max_client_batch_size=limit)


def make_handler(worker: SyncEngineArray, concurrency: Concurrency | None = None) -> Any:
    """The RunPod handler over started engines.

    A job RunPod stops (cancel, timeout) cancels the awaiting task here, and the engine
    loop carries that cancellation to the engines, so the job's texts leave the batch
    queue instead of being computed for nobody.
    """
    limit = worker.settings.max_client_batch_size
    counting = concurrency if concurrency is not None else Concurrency(worker.engines, 1)

    async def handler(job: dict[str, Any]) -> Any:
        job_input = job.get("input")
        if not isinstance(job_input, dict):
            return _error(
                "job input must be a JSON object: {'input': [...]}, {'query', 'documents'} "
                "or {'openai_route', 'openai_input'}"
            )
        try:
            with counting:
                output = await worker.loop.run_async(_dispatch(worker.engines, job_input, limit))
        except EmberError as exc:
            return _error(f"{exc.status_code} {exc.type}: {exc.message}")
        except Exception as exc:  # a job must fail with a message, never crash the worker
            log.exception("job %s failed", job.get("id"))
            refresh = fatal_cuda(exc)
            if refresh:
                log.critical("fatal CUDA error: asking RunPod to replace this worker")
            return _error(f"500 server_error: {type(exc).__name__}: {exc}", refresh=refresh)
        too_big = oversized(output)
        return _error(too_big) if too_big else output

    return handler


def main() -> None:
    """Check the knobs, load and warm every model, then take jobs from RunPod."""
    fixed = concurrency_from_env(os.environ)
    settings = settings_from_env(**model_overrides(os.environ))
    configure_logging(settings.log_level, settings.json_logs)
    # Loads and warms every model on the core's engine loop (a daemon thread) before the
    # first job; a failure raises here, so the worker exits and RunPod reports it.
    worker = SyncEngineArray(settings)
    atexit.register(worker.close)  # after RunPod's loop returns on SIGTERM
    concurrency = Concurrency(worker.engines, queue_fit(settings.model_specs()), fixed)
    log.info(
        "ember runpod worker ready: models=%s concurrency=%s (at most %d)",
        worker.engines.names,
        concurrency.initial if fixed is None else f"{fixed} fixed",
        concurrency.fixed or concurrency.ceiling,
    )
    runpod.serverless.start(
        {"handler": make_handler(worker, concurrency), "concurrency_modifier": concurrency}
    )


if __name__ == "__main__":
    main()
