"""Fail at start when the host shows an NVIDIA GPU that torch cannot use.

``--device auto`` falls back to the CPU when ``torch.cuda.is_available()`` is false. On a
GPU host that is almost never what the operator wants: it means the torch wheel's CUDA
needs a newer driver than the host has (a CUDA 13 wheel needs driver R580; SageMaker's
default GPU hosts run 470-550), or the container lacks the driver libraries. Served on
CPU, the model "works" at a fraction of the speed and nobody is told. So a visible
device node with no CUDA in torch is an error that names the likely cause; ``--device
cpu`` is the explicit way to run on the CPU of a GPU host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ember.errors import ConfigError

# What the NVIDIA container runtime mounts into a container given a GPU.
NODES = ("nvidia0", "nvidiactl")


def visible_nvidia_nodes(
    dev: Path = Path("/dev"), env: Mapping[str, str] = os.environ
) -> list[str]:
    """The NVIDIA device nodes present, unless CUDA_VISIBLE_DEVICES hides every GPU."""
    if env.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return []
    return [str(dev / name) for name in NODES if (dev / name).exists()]


def check_cuda_visible(
    cuda_available: bool,
    torch_cuda: str | None,
    init_error: str | None = None,
    dev: Path = Path("/dev"),
    env: Mapping[str, str] = os.environ,
) -> None:
    """Raise if an NVIDIA device node is visible but torch reports no CUDA device.

    ``torch_cuda`` is ``torch.version.cuda`` (None for a CPU-only wheel), ``init_error``
    what torch said when CUDA failed to initialise, if anything.
    """
    nodes = visible_nvidia_nodes(dev, env)
    if cuda_available or not nodes:
        return
    if torch_cuda is None:
        cause = "this torch is a CPU-only build; install the CUDA build for this host"
    else:
        cause = (
            f"this torch is built for CUDA {torch_cuda}; the host's NVIDIA driver is probably "
            "older than that CUDA needs (CUDA 13 needs driver R580 or newer), or the driver "
            "libraries are not mounted into the container"
        )
    detail = f" (torch: {init_error.strip()})" if init_error else ""
    raise ConfigError(
        f"{' and '.join(nodes)} visible, but torch sees no CUDA device: {cause}{detail}. "
        "Serving would silently run on the CPU; pass --device cpu (EMBER_DEVICE=cpu) if "
        "that is intended."
    )


def torch_cuda_check(torch: object) -> None:
    """``check_cuda_visible`` for an imported torch, with its CUDA initialisation error."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())  # type: ignore[attr-defined]
    said = "; ".join(str(w.message) for w in caught if "CUDA" in str(w.message)) or None
    check_cuda_visible(available, torch.version.cuda, said)  # type: ignore[attr-defined]


def cuda_builds_installed() -> list[str]:
    """The installed packages built for NVIDIA GPUs, read from their metadata (no import):
    a torch whose requirements pull NVIDIA's CUDA libraries (PyPI's default build; the
    ``+cpu`` build pulls none), and onnxruntime-gpu."""
    from importlib import metadata

    found = []
    try:
        torch_meta = metadata.distribution("torch")
        if any(req.startswith("nvidia-") for req in torch_meta.requires or ()):
            found.append(f"torch {torch_meta.version}")
    except metadata.PackageNotFoundError:
        pass
    try:
        found.append(f"onnxruntime-gpu {metadata.version('onnxruntime-gpu')}")
    except metadata.PackageNotFoundError:
        pass
    return found


def no_gpu_visible_note(
    devices: str | None,
    dev: Path = Path("/dev"),
    env: Mapping[str, str] = os.environ,
    builds: list[str] | None = None,
) -> str | None:
    """One line for the start-up log when a CUDA install (the ``cuda`` image) starts where
    no NVIDIA GPU is visible: it serves on the CPU, which is right on a laptop and a
    mistake on a GPU node whose container was not given the GPU. None when a GPU is
    visible, when every model asks for ``--device cpu``, or when nothing is built for CUDA."""
    asked = {d.strip() for d in (devices or "auto").split(",") if d.strip()} or {"auto"}
    if asked == {"cpu"} or visible_nvidia_nodes(dev, env):
        return None
    hidden = env.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1")
    builds = cuda_builds_installed() if builds is None else builds
    if not builds:
        return None
    why = "CUDA_VISIBLE_DEVICES hides every GPU" if hidden else f"no {dev}/nvidia* device node"
    return (
        f"no GPU visible ({why}): this install is built for CUDA ({', '.join(builds)}) and "
        "serves on the CPU; give the container a GPU (docker run --gpus all, a Kubernetes "
        "nvidia.com/gpu limit) or pass --device cpu to say that the CPU is meant"
    )
