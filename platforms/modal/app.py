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
EMBER_MODAL_GPU                  L4         GPU type (``T4``, ``L4``, ``A10G``, ``L40S``, ...);
                                            empty: CPU-only containers
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
EMBER_MODAL_SECRET               (none)     a Modal Secret holding EMBER_API_KEY (and HF_TOKEN)
EMBER_MODAL_GPU_SNAPSHOT         0          ``1``: GPU memory snapshots (alpha): the weights are
                                            loaded onto the GPU before the snapshot
===============================  =========  ==================================================

Every other ``EMBER_*`` variable set when deploying (``EMBER_MODEL_ID``, ``EMBER_DTYPE``,
``EMBER_MAX_BATCH_TOKENS``, ...) is forwarded into the container unchanged, except the API
key: it reaches the container as a ``modal.Secret`` (``EMBER_MODAL_SECRET``, or one made
from ``EMBER_API_KEY`` at deploy time), never as image content or a plain variable.

The image is ``debian_slim`` with the pinned torch wheel, which brings its own CUDA
libraries (no CUDA base image to pull), then the baked weights, whose layer depends on
the model ids and revisions alone (``platforms/bake.py``), then Ember's source, added last
and at container start: a code edit or a setting change rebuilds nothing below it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import modal
import numpy as np

from ember.engine import EmbedRequest
from ember.platform import (
    ASGIApp,
    EngineLoop,
    build_engines,
    concurrency_limits,
    create_app,
    dispatch_invocation,
    ember_env,
    env_int,
    prefetch,
    preload_runtime,
    preload_weights,
    read_pins,
    settings_from_env,
)

# ---- the image ---------------------------------------------------------------------------
# debian_slim plus the pinned torch wheel: the wheel depends on NVIDIA's CUDA 13 and cuDNN
# pip packages, so a CUDA base image would only add a second copy of them (and a multi-GB
# pull). Hosts need a driver of the R580 series or newer for CUDA 13; Modal's are. To bump
# torch, change it in platforms/constraints.txt, redeploy, and check /info says device=cuda.
PYTHON_VERSION = "3.11"
PLATFORMS = Path(__file__).resolve().parents[1]
CONSTRAINTS = PLATFORMS / "constraints.txt"
BAKE_SCRIPT = PLATFORMS / "bake.py"
BAKE_PATH = "/opt/ember/bake.py"
HF_HOME = "/models/hf"  # weights baked into the image live here
HF_VOLUME_PATH = "/cache/hf"  # ... or here, when a Volume holds them
# Settings that must not become image content or a plain container variable.
SECRET_SETTINGS = frozenset({"EMBER_API_KEY"})


def constraint_pins(section: str) -> list[str]:
    """This platform's pins from the one constraints file (read by the core's parser)."""
    return read_pins(section, CONSTRAINTS)


def bake_command(env: Mapping[str, str]) -> str | None:
    """The build step that downloads the weights: it names the model ids and revisions and
    nothing else, so no other setting (the API key included) invalidates the layer."""
    given = ember_env(env)
    ids = given.get("model_id")
    if not ids:
        return None  # the packaged all-MiniLM-L6-v2 (a pinned package) is served
    revisions = given.get("revision", "")
    return f"python {BAKE_PATH} {shlex.quote(ids)} {shlex.quote(revisions)}"


def image_steps(
    env: Mapping[str, str], weights: str, pins: list[str] | None
) -> list[tuple[str, tuple, dict]]:
    """The image as data, in layer order: (``modal.Image`` method, args, kwargs)."""
    steps: list[tuple[str, tuple, dict]] = [("uv_pip_install", tuple(pins), {})] if pins else []
    steps.append(
        ("env", ({"HF_HUB_DISABLE_TELEMETRY": "1", "TOKENIZERS_PARALLELISM": "false"},), {})
    )
    bake = bake_command(env) if weights == "image" else None
    if bake:
        steps += [
            ("add_local_file", (str(BAKE_SCRIPT), BAKE_PATH), {"copy": True}),
            ("run_commands", (bake,), {"env": {"HF_HOME": HF_HOME}}),
            ("env", ({"HF_HUB_OFFLINE": "1"},), {}),
        ]
    # Last, and mounted at container start rather than built in (copy=False).
    steps.append(("add_local_python_source", ("ember",), {}))
    return steps


def build_image(env: Mapping[str, str], weights: str) -> modal.Image:
    image = modal.Image.debian_slim(python_version=PYTHON_VERSION)
    # The pins file exists only where the app is deployed from.
    pins = constraint_pins("modal") if modal.is_local() else None
    for method, args, kwargs in image_steps(env, weights, pins):
        image = getattr(image, method)(*args, **kwargs)
    return image


def secrets(env: Mapping[str, str]) -> list[modal.Secret]:
    """The API key's way into the container: a named Modal Secret, or one made from
    EMBER_API_KEY at deploy time (kept by Modal as a secret, not in the image)."""
    found = []
    if name := env.get("EMBER_MODAL_SECRET", "").strip():
        found.append(modal.Secret.from_name(name))
    if key := ember_env(env).get("api_key"):
        found.append(modal.Secret.from_dict({"EMBER_API_KEY": key}))
    return found


WEIGHTS = os.environ.get("EMBER_MODAL_WEIGHTS", "image").strip().lower()
if WEIGHTS not in ("image", "volume"):
    raise ValueError(f"EMBER_MODAL_WEIGHTS must be 'image' or 'volume', got {WEIGHTS!r}")
# Forwarded into the containers: the deploy-time EMBER_* variables, secrets excepted.
# In a container this reads back the same values, so both sides agree.
CONTAINER_ENV: dict[str, str | None] = {
    k: v
    for k, v in sorted(os.environ.items())
    if k.startswith("EMBER_") and k not in SECRET_SETTINGS
}
CONTAINER_ENV["HF_HOME"] = HF_VOLUME_PATH if WEIGHTS == "volume" else HF_HOME
SECRETS = secrets(os.environ) if modal.is_local() else []  # deploy-time objects
GPU = os.environ.get("EMBER_MODAL_GPU", "L4").strip() or None
GPU_SNAPSHOT = bool(GPU) and os.environ.get("EMBER_MODAL_GPU_SNAPSHOT", "") in ("1", "true")

SETTINGS = settings_from_env()  # a bad EMBER_* value fails `modal deploy`, not a container
TARGET_INPUTS, MAX_INPUTS = concurrency_limits(SETTINGS, "EMBER_MODAL")
VOLUMES: dict[str | os.PathLike[str], modal.Volume] = {}
if WEIGHTS == "volume":
    VOLUMES[HF_VOLUME_PATH] = modal.Volume.from_name(
        os.environ.get("EMBER_MODAL_VOLUME", "ember-hf-cache"), create_if_missing=True
    )

APP_NAME = os.environ.get("EMBER_MODAL_APP_NAME", "ember")
app = modal.App(APP_NAME, image=build_image(os.environ, WEIGHTS), secrets=SECRETS)


# ---- the service -------------------------------------------------------------------------
@app.cls(
    gpu=GPU,
    env=CONTAINER_ENV,
    volumes=VOLUMES,
    min_containers=env_int("EMBER_MODAL_MIN_CONTAINERS", 1),
    max_containers=env_int("EMBER_MODAL_MAX_CONTAINERS", None),
    buffer_containers=env_int("EMBER_MODAL_BUFFER_CONTAINERS", 0) or None,
    scaledown_window=env_int("EMBER_MODAL_SCALEDOWN_WINDOW", 300),
    startup_timeout=env_int("EMBER_MODAL_STARTUP_TIMEOUT", 900),
    timeout=int(SETTINGS.request_timeout) + 60,
    enable_memory_snapshot=True,
    experimental_options={"enable_gpu_snapshot": True} if GPU_SNAPSHOT else None,
)
@modal.concurrent(max_inputs=MAX_INPUTS, target_inputs=TARGET_INPUTS)
class Ember:
    """One container: every configured model, loaded once, behind HTTP and ``.map()``."""

    @modal.enter(snap=True)
    def prepare(self) -> None:
        """Before the memory snapshot: as much of a cold start as the snapshot can hold.

        Always: resolving each model (its config files; downloading into the Volume when
        weights=volume) and importing the backend it will load with (torch and
        transformers, for ``auto`` on the GPU the container gets). Where the snapshot can
        hold the loaded engines too, they are loaded here: with GPU snapshots
        (EMBER_MODAL_GPU_SNAPSHOT=1, the GPU is attached now) and on CPU-only containers.
        Otherwise torch models' weights are loaded onto the CPU here, in the dtype the GPU
        will serve them in, so the snapshot holds them and ``load`` only moves them.
        """
        self.settings = settings_from_env()
        self.resolved = prefetch(self.settings)
        preload_runtime(self.resolved, accelerator="cuda" if GPU else None)
        if WEIGHTS == "volume" and not modal.is_local():
            for volume in VOLUMES.values():
                volume.commit()  # later containers find the weights already downloaded
        self.engine_loop = EngineLoop()
        self.engines = None
        if GPU_SNAPSHOT or not GPU:
            self._start_engines()
        else:
            preload_weights(self.resolved, accelerator="cuda")

    @modal.enter(snap=False)
    def load(self) -> None:
        """After restore, with the GPU attached: load weights onto it and warm up (unless
        the snapshot already holds them)."""
        if self.engines is None:
            self._start_engines()

    def _start_engines(self) -> None:
        self.engines = self.engine_loop.run(build_engines(self.settings))
        self.http = create_app(self.settings, self.engines)

    @modal.exit()
    def unload(self) -> None:
        """Free the GPU on scale-down (the ASGI lifespan may have stopped the engines)."""
        if self.engines is not None and self.engines.started:
            self.engine_loop.run(self.engines.stop())
        self.engine_loop.close()

    @modal.method()
    def embed(self, texts: list[str], model: str | None = None) -> np.ndarray:
        """Embeddings for one batch of texts, for ``Ember().embed.map(batches)`` corpus jobs:
        a float32 array (rows in input order), a quarter of the bytes of lists of floats
        on the way back from the container.

        Goes through the same engine (batcher, normalisation) as ``/v1/embeddings``.
        """
        engine = self.engines.for_task(model, "embed")
        result = self.engine_loop.run(engine.embed(EmbedRequest(texts)))
        return np.asarray(result.outputs, dtype=np.float32)

    @modal.method()
    def invoke(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Any JSON body the HTTP routes take (OpenAI, Cohere, TEI), answered as they would;
        fields such as ``modality`` reach the core as sent."""
        return self.engine_loop.run(dispatch_invocation(self.engines, payload))

    @modal.asgi_app()
    def web(self) -> ASGIApp:
        """The core's FastAPI app: /v1/embeddings, /v1/rerank, /embed, /rerank, /ready..."""
        return self.engine_loop.asgi(self.http)
