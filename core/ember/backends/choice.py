"""``--backend auto`` (the default): which backend serves a model nobody named one for.

ONNX Runtime on CPU, torch everywhere else. On this project's 2-core CPU the packaged
MiniLM served through onnx fp32 gave the same vectors as torch (worst cosine 1.00000
against sentence-transformers), started in 1.1 s from its cached graph against 4.8 s,
idled at 264 MiB against 542 and answered one short sentence in 5.4 ms against 13.2
(benchmarks/results/2026-11-30-cpu-fastpath.md). Torch stays the choice wherever ORT
cannot run the model as asked: an accelerator, a dtype ORT has no CPU kernels for,
``--torch-compile``, or remote code that may not export. A directory written by
``ember export`` is served by the backend that wrote it.

The decision is made without importing torch or onnxruntime (``find_spec`` and device
nodes only), so choosing costs nothing on the fast path it picks.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from pathlib import Path

from ember.backends import artifacts
from ember.backends.neuron_backend import MANIFEST_NAME as NEURON_MANIFEST
from ember.models.spec import ResolvedModel

AUTO = "auto"
CPU_ONNX_DTYPES = ("auto", "float32", "int8")


def accelerator_visible() -> str | None:
    """The accelerator ``--device auto`` would give torch, found without importing it."""
    if sys.platform == "darwin":
        return "mps"
    if Path("/dev/nvidiactl").exists() or any(Path("/proc/driver/nvidia/gpus").glob("*")):
        return "cuda"
    return None


def onnxruntime_installed() -> bool:
    return find_spec("onnxruntime") is not None and find_spec("onnx") is not None


def choose_backend(model: ResolvedModel) -> tuple[str, str]:
    """(backend, the reason in words) for ``model``, whose spec asks for ``auto``."""
    spec = model.spec
    if (model.path / NEURON_MANIFEST).is_file():
        return "neuron", "the directory is an `ember export --backend neuron` artifact"
    exported = artifacts.read_manifest(model.path) or {}
    if exported.get("backend") in ("onnx", "ct2"):
        name = exported["backend"]
        return name, f"the directory is an `ember export --backend {name}` artifact"
    if spec.device not in ("auto", "cpu"):
        return "torch", f"--device {spec.device}"
    if spec.device == "auto" and (accelerator := accelerator_visible()):
        return "torch", f"a {accelerator} device is visible"
    if spec.dtype not in CPU_ONNX_DTYPES:
        return "torch", f"--dtype {spec.dtype} has no ONNX Runtime CPU path"
    if spec.torch_compile:
        return "torch", "--torch-compile asked for"
    if spec.trust_remote_code:
        return "torch", "remote-code models may not export to ONNX"
    if not onnxruntime_installed():
        return "torch", "onnxruntime is not installed (pip install 'ember[onnx]')"
    return "onnx", "CPU with onnxruntime installed"
