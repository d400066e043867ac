"""Ember on BentoML: the core's FastAPI app mounted in a BentoML service.

Serve locally with ``bentoml serve platforms.bentoml.service:Ember``; build a Bento with
``bentoml build -f platforms/bentoml/bentofile.yaml .`` (see docs/platforms/bentoml.md).

Thin on purpose: settings come from ``EMBER_*`` variables, the engines and the HTTP app
are the core's (``ember.platform.create_app``), mounted at ``/`` so every route is the one
``ember serve`` has. BentoML adds its own ``/livez``, ``/readyz`` and ``/metrics``; the
readiness hook ``__is_ready__`` reports ready only once every model is loaded and warm.

BentoML-only knobs (read at import, i.e. when serving or building):

==============================  ===========  ===============================================
variable                        default      meaning
==============================  ===========  ===============================================
EMBER_BENTOML_GPU_TYPE          nvidia-l4    GPU annotation for BentoCloud instance choice
EMBER_BENTOML_GPUS              1            GPUs per replica (0: a CPU-only service)
EMBER_BENTOML_MAX_CONCURRENCY   (derived)    requests past this get 429 from BentoML
EMBER_BENTOML_CONCURRENCY       (derived)    per-replica concurrency BentoCloud scales on
==============================  ===========  ===============================================
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import bentoml
from prometheus_client import generate_latest

from ember.engine import EngineArray
from ember.platform import (
    concurrency_limits,
    create_app,
    ember_env,
    env_int,
    read_pins,
    settings_from_env,
)

# Pinned by full tag; its CUDA major matches the pinned torch wheel's (torch 2.13.0: CUDA
# 13.0). To bump it, change it with torch in platforms/constraints.txt, rebuild, and check
# /info reports device=cuda.
CUDA_IMAGE = "nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04"
# The Bento's generated Dockerfile has no build arguments of its own: these variables, read
# by `bentoml build`, are its BASE_IMAGE (another base, such as the suite's local stand-in)
# and its torch wheel choice (cpu: the CPU build of the pinned version, from
# EMBER_BENTOML_TORCH_CPU_INDEX; empty: the installer's own configuration finds it). They
# describe the build, so they are not written into the image's environment.
BUILD_SETTINGS = frozenset(
    {"EMBER_BENTOML_BASE_IMAGE", "EMBER_BENTOML_TORCH_WHEEL", "EMBER_BENTOML_TORCH_CPU_INDEX"}
)
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# The CUDA base has no Python and no pip, which BentoML's generated Dockerfile needs to
# install uv (it then makes the Python 3.11 venv with uv): a venv from the base's own
# python3 holds uv, at BentoML's own pin.
UV_SETUP = (
    "python3 -m venv /opt/uv && /opt/uv/bin/pip install --no-cache-dir uv==0.13.4 "
    "&& ln -sf /opt/uv/bin/uv /usr/local/bin/uv"
)
PYTHON_VERSION = "3.11"
CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints.txt"
BAKED_HF_HOME = "/home/bentoml/.cache/huggingface"  # the serving user's default HF cache
BENTO_CORE = "/home/bentoml/bento/src/core"  # the Bento's copy of core/ in its image


def constraint_pins(section: str) -> list[str]:
    """This platform's pins from the one constraints file (read by the core's parser)."""
    return read_pins(section, CONSTRAINTS)


# Resolves once, here, in the process that serves: the engines are created (cheap, nothing
# loaded) so the service can report on them; the app's lifespan loads and warms them.
SETTINGS = settings_from_env()
ENGINES = EngineArray.from_settings(SETTINGS)
HTTP = create_app(SETTINGS, ENGINES)

TARGET_INPUTS, MAX_INPUTS = concurrency_limits(SETTINGS, "EMBER_BENTOML")
GPUS = env_int("EMBER_BENTOML_GPUS", 1) or 0

# Settings that must not be written into the Bento or its image (BentoML turns every
# entry of `envs` into ARG/ENV lines of the generated Dockerfile). Give them at run time:
# a BentoCloud secret (`bentoml deploy --secret ...`) or `docker run -e EMBER_API_KEY=...`.
SECRET_SETTINGS = frozenset({"EMBER_API_KEY"})
BAKED_SRC = "./src/platforms/bake.py"  # where build_include puts platforms/bake.py


def bake_command(env: dict[str, str]) -> str | None:
    """The weight download, naming the model ids and revisions and nothing else (so no
    other setting invalidates the layer); None when the packaged default model serves."""
    given = ember_env(env)
    ids = given.get("model_id")
    if not ids:
        return None
    revisions = given.get("revision", "")
    return (
        f"mkdir -p {BAKED_HF_HOME} && HF_HOME={BAKED_HF_HOME} python {BAKED_SRC} "
        f"{shlex.quote(ids)} {shlex.quote(revisions)}"
        f" && chown -R bentoml:bentoml {BAKED_HF_HOME.rsplit('/', 1)[0]}"
    )


def python_packages(env: dict[str, str]) -> list[str]:
    """The "# bentoml" pins; EMBER_BENTOML_TORCH_WHEEL=cpu swaps torch for its CPU build."""
    pins = constraint_pins("bentoml")
    wheel = env.get("EMBER_BENTOML_TORCH_WHEEL", "cuda")
    if wheel not in ("cpu", "cuda"):
        raise ValueError(f"EMBER_BENTOML_TORCH_WHEEL must be cpu or cuda, got {wheel!r}")
    if wheel == "cuda":
        return pins
    index = env.get("EMBER_BENTOML_TORCH_CPU_INDEX", TORCH_CPU_INDEX)
    cpu = [f"{pin}+cpu" if pin.startswith("torch==") else pin for pin in pins]
    return ([f"--extra-index-url {index}"] if index else []) + cpu


def build_image(env: dict[str, str]) -> bentoml.images.Image:
    """Layer order is cache order. BentoML copies `build_include` files ahead of the
    package install, so only bake.py is included there: the pinned packages install, then
    the weights, and Ember's source arrives with the Bento's final copy (it is imported
    from src/core through PYTHONPATH; its dependencies are the pins). An edit to core/
    reinstalls nothing and downloads nothing."""
    image = (
        bentoml.images.Image(
            base_image=env.get("EMBER_BENTOML_BASE_IMAGE") or CUDA_IMAGE,
            python_version=PYTHON_VERSION,
            lock_python_packages=False,
        )
        .system_packages("python3-venv")
        .run(UV_SETUP)
        .build_include("platforms/bake.py")
        .python_packages(*python_packages(env))
    )
    bake = bake_command(env)
    return image.run(bake) if bake else image


IMAGE = build_image(dict(os.environ))

# EMBER_* set when building become ENV in the image, so the container serves the same
# models; on a workstation, `bentoml serve` lets variables already set win. Secrets are
# left out; PYTHONPATH makes the Bento's copy of the core importable in the container.
ENVS: list[dict[str, str]] = [
    {"name": k, "value": v}
    for k, v in sorted(os.environ.items())
    if k.startswith("EMBER_") and k not in SECRET_SETTINGS | BUILD_SETTINGS
]
ENVS.append({"name": "PYTHONPATH", "value": BENTO_CORE})

RESOURCES: dict[str, Any] = {}
if GPUS:
    RESOURCES = {"gpu": GPUS, "gpu_type": os.environ.get("EMBER_BENTOML_GPU_TYPE", "nvidia-l4")}


@bentoml.service(
    name="ember",
    image=IMAGE,
    envs=ENVS,
    resources=RESOURCES,
    workers=1,  # one process owns the GPU; the batcher gives it parallelism
    traffic={
        "timeout": SETTINGS.request_timeout + 30,
        "max_concurrency": MAX_INPUTS,
        "concurrency": TARGET_INPUTS,
    },
)
@bentoml.asgi_app(HTTP, path="/")
class Ember:
    """Holds nothing of its own: the mounted core app serves, the engines say when ready."""

    def __init__(self) -> None:
        self.engines = ENGINES

    def __is_ready__(self) -> bool:
        """BentoML's /readyz: 200 only after every model is loaded and warmed up."""
        return self.engines.ready

    def __is_alive__(self) -> bool:
        """BentoML's /livez: 503 once loading has failed, so the orchestrator restarts us."""
        return HTTP.state.load_error is None

    def __metrics__(self, content: str) -> str:
        """BentoML's /metrics shadows the core's route: append the core's series (queue
        depth, batch sizes, stage timings) so one scrape sees both."""
        return content + generate_latest(self.engines.metrics.registry).decode()
