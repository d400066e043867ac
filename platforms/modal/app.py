"""Ember on Modal: the core's HTTP API and a `.map()`-able embedding method, warm on GPUs.

Deploy with ``modal deploy platforms/modal/app.py`` (see docs/platforms/modal.md).

This module is deliberately thin. Settings come from ``EMBER_*`` variables through the
core (``ember.platform.settings_from_env``), the engines and the HTTP app are the core's
own (``ember.platform.build_engines``, ``ember.platform.create_app``), so the routes served
here are byte-for-byte the routes ``ember serve`` has. What lives here is only what is
Modal's: the image, the autoscaling knobs, the lifecycle hooks and the entry points.

Modal-only knobs are ``EMBER_MODAL_*`` variables read when the app is deployed:

===============================  =========  ==================================================
variable                         default    meaning
===============================  =========  ==================================================
EMBER_MODAL_APP_NAME             ember      Modal app name (and URL label prefix)
EMBER_MODAL_GPU                  L4         GPU type (``T4``, ``L4``, ``A10G``, ``L40S``, ...)
EMBER_MODAL_MIN_CONTAINERS       1          containers kept warm even when idle (0: scale to 0)
EMBER_MODAL_MAX_CONTAINERS       (none)     upper bound on containers
EMBER_MODAL_BUFFER_CONTAINERS    0          extra idle containers kept while under load
EMBER_MODAL_SCALEDOWN_WINDOW     300        seconds an idle container lingers before it stops
EMBER_MODAL_STARTUP_TIMEOUT      900        seconds a container may take to load and warm up
EMBER_MODAL_WEIGHTS              image      ``image``: download at build time into the image;
                                            ``volume``: a Modal Volume holds the HF cache
EMBER_MODAL_VOLUME               ember-hf-cache  the Volume's name when weights=volume
EMBER_MODAL_TARGET_INPUTS        (derived)  concurrent requests per container Modal aims for
EMBER_MODAL_MAX_INPUTS           (derived)  hard cap of concurrent requests per container
===============================  =========  ==================================================

Every other ``EMBER_*`` variable set when deploying (``EMBER_MODEL_ID``, ``EMBER_DTYPE``,
``EMBER_MAX_BATCH_TOKENS``, ...) is forwarded into the container unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import modal

from ember.platform import (
    ASGIApp,
    EngineLoop,
    build_engines,
    concurrency_limits,
    create_app,
    dispatch_invocation,
    env_int,
    prefetch,
    preload_runtime,
    read_pins,
    settings_from_env,
)

# ---- the image ---------------------------------------------------------------------------
# Pinned by full tag so a rebuild months from now gets the same CUDA userland. The CUDA
# major matches the one the pinned torch wheel bundles (torch 2.13.0: CUDA 13.0, cuDNN 9),
# so both need a host driver of the R580 series or newer. To bump: change the tag here and
# in platforms/bentoml/service.py together with torch in platforms/constraints.txt, redeploy,
# and check that /info reports device=cuda.
CUDA_IMAGE = "nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04"
PYTHON_VERSION = "3.11"
CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"
HF_HOME = "/models/hf"  # weights baked into the image live here
HF_VOLUME_PATH = "/cache/hf"  # ... or here, when a Volume holds them


def constraint_pins(section: str) -> list[str]:
    """This platform's pins from the one constraints file (read by the core's parser)."""
    return read_pins(section, CONSTRAINTS)


WEIGHTS = os.environ.get("EMBER_MODAL_WEIGHTS", "image").strip().lower()
if WEIGHTS not in ("image", "volume"):
    raise ValueError(f"EMBER_MODAL_WEIGHTS must be 'image' or 'volume', got {WEIGHTS!r}")
# Forwarded into the build step and the containers: the deploy-time EMBER_* variables.
# In a container this reads back the same values, so both sides agree.
CONTAINER_ENV: dict[str, str | None] = {
    k: v for k, v in sorted(os.environ.items()) if k.startswith("EMBER_")
}
CONTAINER_ENV["HF_HOME"] = HF_VOLUME_PATH if WEIGHTS == "volume" else HF_HOME


def build_image() -> modal.Image:
    image = modal.Image.from_registry(CUDA_IMAGE, add_python=PYTHON_VERSION)
    if modal.is_local():  # the pins file exists only where the app is deployed from
        image = image.uv_pip_install(*constraint_pins("modal"))
    image = image.env({"HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"})
    image = image.add_local_python_source("ember", copy=True)
    if WEIGHTS == "image":
        image = image.run_function(prefetch, env=CONTAINER_ENV).env({"HF_HUB_OFFLINE": "1"})
    return image


SETTINGS = settings_from_env()  # a bad EMBER_* value fails `modal deploy`, not a container
TARGET_INPUTS, MAX_INPUTS = concurrency_limits(SETTINGS, "EMBER_MODAL")
VOLUMES: dict[str | os.PathLike[str], modal.Volume] = {}
if WEIGHTS == "volume":
    VOLUMES[HF_VOLUME_PATH] = modal.Volume.from_name(
        os.environ.get("EMBER_MODAL_VOLUME", "ember-hf-cache"), create_if_missing=True
    )

app = modal.App(os.environ.get("EMBER_MODAL_APP_NAME", "ember"), image=build_image())


# ---- the service -------------------------------------------------------------------------
@app.cls(
    gpu=os.environ.get("EMBER_MODAL_GPU", "L4"),
    env=CONTAINER_ENV,
    volumes=VOLUMES,
    min_containers=env_int("EMBER_MODAL_MIN_CONTAINERS", 1),
    max_containers=env_int("EMBER_MODAL_MAX_CONTAINERS", None),
    buffer_containers=env_int("EMBER_MODAL_BUFFER_CONTAINERS", 0) or None,
    scaledown_window=env_int("EMBER_MODAL_SCALEDOWN_WINDOW", 300),
    startup_timeout=env_int("EMBER_MODAL_STARTUP_TIMEOUT", 900),
    timeout=int(SETTINGS.request_timeout) + 60,
    enable_memory_snapshot=True,
)
@modal.concurrent(max_inputs=MAX_INPUTS, target_inputs=TARGET_INPUTS)
class Ember:
    """One container: every configured model, loaded once, behind HTTP and ``.map()``."""

    @modal.enter(snap=True)
    def prepare(self) -> None:
        """Before the memory snapshot (no GPU attached): the CPU-side part of a cold start.

        Resolving each model (reading its config files, downloading into the Volume when
        weights=volume) and importing the backend it will load with (torch and
        transformers, for ``auto`` on the GPU the container gets) are captured in the
        snapshot, so restored containers skip them.
        """
        self.settings = settings_from_env()
        self.resolved = prefetch(self.settings)
        preload_runtime(self.resolved, accelerator="cuda")
        if WEIGHTS == "volume" and not modal.is_local():
            for volume in VOLUMES.values():
                volume.commit()  # later containers find the weights already downloaded

    @modal.enter(snap=False)
    def load(self) -> None:
        """After restore, with the GPU attached: load weights onto it and warm up."""
        self.engine_loop = EngineLoop()
        self.engines = self.engine_loop.run(build_engines(self.settings))
        self.http = create_app(self.settings, self.engines)

    @modal.exit()
    def unload(self) -> None:
        """Free the GPU on scale-down (the ASGI lifespan may have stopped the engines)."""
        if self.engines.started:
            self.engine_loop.run(self.engines.stop())
        self.engine_loop.close()

    @modal.method()
    def embed(self, texts: list[str], model: str | None = None) -> list[list[float]]:
        """Embeddings for one batch of texts, for ``Ember().embed.map(batches)`` corpus jobs.

        Goes through the same engine (batcher, normalisation) as ``/v1/embeddings``.
        """
        engine = self.engines.for_task(model, "embed")
        result = self.engine_loop.run(engine.embed(texts))
        return result.outputs.tolist()

    @modal.method()
    def invoke(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Any JSON body the HTTP routes take (OpenAI, Cohere, TEI), answered as they would."""
        return self.engine_loop.run(dispatch_invocation(self.engines, payload))

    @modal.asgi_app()
    def web(self) -> ASGIApp:
        """The core's FastAPI app: /v1/embeddings, /v1/rerank, /embed, /rerank, /ready..."""
        return self.engine_loop.asgi(self.http)
