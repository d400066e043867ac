"""SageMaker inference container entrypoint: ``docker run <image> serve``.

SageMaker's container contract: it starts the image with the single argument ``serve``,
sends ``GET /ping`` until it answers 200 (within ContainerStartupHealthCheckTimeout), then
forwards each InvokeEndpoint call as ``POST /invocations`` -- all on port 8080, or on
``SAGEMAKER_BIND_TO_PORT`` when the platform sets it. The model tarball given to
CreateModel is unpacked into /opt/ml/model.

This file stays thin: it decides which model to serve, builds the core's app
(``ember.platform.create_app``: every Ember route, error handling, payload limits,
background loading) and adds the two SageMaker routes on top of it:

* ``/ping`` answers exactly what the core's ``/ready`` answers (``EmberApp.readiness``):
  200 once every model is loaded and warmed, 503 before (so no traffic reaches a cold
  container). It is declared an open path, as ``/ready`` is.
* ``/invocations`` takes ``application/json`` (415 otherwise) and hands the body to
  ``ember.platform.dispatch_invocation``, which picks OpenAI embeddings, Cohere/TEI rerank,
  TEI embed or classify by the body's fields and returns the HTTP route's exact body; and
  ``application/jsonlines`` (Batch Transform, ``SplitType=Line``), one output line per
  input line in order (``ember.platform.dispatch_jsonlines``).

Model choice, first match wins: ``EMBER_MODEL_ID`` (explicit), a model in /opt/ml/model
(a Hugging Face model directory, or an ``ember export`` directory, which also selects the
backend that wrote it), ``HF_MODEL_ID`` (+ ``HF_MODEL_REVISION``; the Hugging Face DLC
convention, downloaded at start), else the image's packaged default model.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from fastapi import APIRouter, Request
from fastapi.responses import Response

from ember.engine import EngineArray
from ember.platform import (
    JSONLINES,
    BadRequest,
    EmberApp,
    EmberError,
    ServerSettings,
    configure_logging,
    create_app,
    dispatch_invocation,
    dispatch_jsonlines,
    ember_env,
    exported_backend,
    settings_from_env,
)

log = logging.getLogger("ember.sagemaker")

SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")
# Tests (and local `docker run -v`) point this elsewhere; SageMaker always uses /opt/ml/model.
MODEL_DIR_ENV = "EMBER_SAGEMAKER_MODEL_DIR"
DEFAULT_PORT = 8080
PING = "/ping"
# SageMaker's limits on one real-time invocation; deploy.py names a longer limit for
# asynchronous endpoints and Batch Transform through INVOCATION_TIMEOUT_ENV.
REALTIME_INVOCATION_TIMEOUT_S = 60.0
REALTIME_PAYLOAD_BYTES = 6 * 1024 * 1024
INVOCATION_TIMEOUT_ENV = "EMBER_SAGEMAKER_INVOCATION_TIMEOUT"
ANSWER_MARGIN_S = 5.0  # Ember's 504 leaves this long before SageMaker's cut


def find_model_dir(root: Path) -> Path | None:
    """The model directory inside SageMaker's unpacked artifact, if there is one.

    Accepts the files at the root (what deploy.py packages) or one folder level down
    (a tarball made with ``tar czf model.tar.gz my-model/``).
    """
    if not root.is_dir():
        return None

    def is_model(path: Path) -> bool:
        return (path / "config.json").is_file() or exported_backend(path) is not None

    if is_model(root):
        return root
    children = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    if len(children) == 1 and is_model(children[0]):
        return children[0]
    return None


def model_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """Settings overrides that pick the model per the order in the module docstring."""
    given = ember_env(env)
    if "model_id" in given:
        return {}
    model_dir = find_model_dir(Path(env.get(MODEL_DIR_ENV, str(SAGEMAKER_MODEL_DIR))))
    if model_dir is not None:
        overrides: dict[str, Any] = {"model_id": str(model_dir)}
        backend = exported_backend(model_dir)
        if backend is not None and "backend" not in given:
            overrides["backend"] = backend
        return overrides
    if env.get("HF_MODEL_ID", "").strip():
        return {"model_id": env["HF_MODEL_ID"].strip(), "revision": env.get("HF_MODEL_REVISION")}
    return {}


def invocation_limits(
    env: Mapping[str, str], configured_timeout: float
) -> tuple[float, int | None]:
    """(request timeout, payload limit or None to keep the core's) for this container.

    SageMaker cuts an invocation at its own limit (60 s on real-time endpoints; deploy.py
    sets ``EMBER_SAGEMAKER_INVOCATION_TIMEOUT`` for asynchronous endpoints and Batch
    Transform, whose limits are longer). Ember's deadline must fall before it, or the
    caller gets SageMaker's bare error instead of Ember's 504; so the deadline defaults to
    the platform's limit less a margin, and one set above that is lowered. A real-time
    body can be up to 6 MB, three times the core's default limit, so that is the default
    here (an explicit ``EMBER_PAYLOAD_LIMIT`` wins).
    """
    raw = env.get(INVOCATION_TIMEOUT_ENV, "").strip()
    cap = float(raw) if raw else REALTIME_INVOCATION_TIMEOUT_S
    ceiling = max(1.0, cap - ANSWER_MARGIN_S)
    given = ember_env(env)
    timeout = configured_timeout if "request_timeout" in given else ceiling
    if timeout > ceiling:
        log.warning(
            "EMBER_REQUEST_TIMEOUT=%s is past SageMaker's %s s invocation limit: using %s s so "
            "Ember answers 504 before SageMaker cuts the request",
            timeout,
            cap,
            ceiling,
        )
        timeout = ceiling
    payload = None if "payload_limit" in given else REALTIME_PAYLOAD_BYTES
    return timeout, payload


def load_settings(env: Mapping[str, str]) -> ServerSettings:
    """Core settings from EMBER_* plus the SageMaker-specific model choice, port and limits."""
    settings = settings_from_env(**model_overrides(env))
    port = int(env.get("SAGEMAKER_BIND_TO_PORT", DEFAULT_PORT))
    timeout, payload = invocation_limits(env, settings.request_timeout)
    update: dict[str, Any] = {"port": port, "request_timeout": timeout}
    if payload is not None:
        update["payload_limit"] = payload
    # SageMaker authenticates InvokeEndpoint with IAM and forwards no Authorization header,
    # and /ping cannot carry one: a key would lock SageMaker out.
    for name in ("api_key", "api_keys_file"):
        if getattr(settings, name):
            log.warning(
                "EMBER_%s is ignored on SageMaker: endpoints are IAM-authenticated", name.upper()
            )
            update[name] = None
    return settings.model_copy(update=update)


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _is_json(content_type: str | None) -> bool:
    return _media(content_type) == "application/json"


def sagemaker_router(app: EmberApp) -> APIRouter:
    """``/ping`` and ``/invocations`` over the core app's engines and readiness."""
    engines: EngineArray = app.state.engines
    settings: ServerSettings = app.state.settings
    router = APIRouter(tags=["SageMaker"])

    @router.get(PING, summary="SageMaker health check: 200 once models are warm")
    async def ping() -> Response:
        return app.readiness()

    @router.post("/invocations", summary="SageMaker InvokeEndpoint: dispatch by body shape")
    async def invocations(request: Request) -> Response:
        content_type = request.headers.get("content-type")
        if _media(content_type) == JSONLINES:  # Batch Transform: one output line per line
            lines = await dispatch_jsonlines(
                engines, await request.body(), max_client_batch_size=settings.max_client_batch_size
            )
            return Response(lines, media_type=JSONLINES)
        if not _is_json(content_type):
            raise EmberError(
                f"Content-Type must be application/json or {JSONLINES}, got "
                f"{content_type or 'none'!r}",
                status_code=415,
                param="Content-Type",
            )
        raw = await request.body()
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None
        body = await dispatch_invocation(
            engines, payload, max_client_batch_size=settings.max_client_batch_size
        )
        return Response(orjson.dumps(body), media_type="application/json")

    return router


def build_app(settings: ServerSettings) -> EmberApp:
    """The core app with SageMaker's routes added; loading fails the process (see main)."""

    def on_load_failure(exc: BaseException) -> None:
        # Exit instead of answering 503 until ContainerStartupHealthCheckTimeout (up to an
        # hour): SageMaker then fails the deployment at once, with this log line in
        # CloudWatch.
        log.critical("model loading failed, exiting: %s", exc)
        os._exit(1)

    app = create_app(settings, on_load_failure=on_load_failure, open_paths=(PING,))
    app.include_router(sagemaker_router(app))
    return app


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["serve"]:
        print(
            "usage: serve.py serve  (SageMaker runs `docker run <image> serve`; "
            "training is not supported)",
            file=sys.stderr,
        )
        return 2
    settings = load_settings(os.environ)
    configure_logging(settings.log_level, settings.json_logs)
    log.info(
        "serving %s on %s:%d",
        settings.model_id or "the default model",
        settings.host,
        settings.port,
    )
    # One process: the engines (and their NeuronCores) belong to it; batching happens
    # inside, so more uvicorn workers would only duplicate the model.
    uvicorn.run(
        build_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,
        timeout_keep_alive=75,  # reuse connections from the SageMaker front end
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
