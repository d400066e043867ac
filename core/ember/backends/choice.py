"""``--backend auto`` (the default): which backend serves a model nobody named one for.

ONNX Runtime on CPU, torch everywhere else. On this project's 2-core CPU the packaged
MiniLM served through onnx fp32 gave the same vectors as torch (worst cosine 1.00000
against sentence-transformers), started in 1.1 s from its cached graph against 4.8 s,
idled at 264 MiB against 542 and answered one short sentence in 5.4 ms against 13.2
(benchmarks/results/2026-11-30-cpu-fastpath.md). Torch stays the choice wherever ORT
cannot run the model as asked: an accelerator, a dtype ORT has no CPU kernels for,
``--torch-compile``, or remote code that may not export. A directory written by
``ember export`` is served by the backend that wrote it; one that ships an OpenVINO IR
(``openvino/openvino_model.xml``, as sentence-transformers saves it) and no ONNX graph is
served from that IR by OpenVINO on a CPU, torch-free, at auto's near-exact default.

CLIP goes the same way (its family's ``cpu_backend``): its towers on onnx fp32 give transformers'
vectors (cosine 1.00000) and, for ViT-B/32 on the same 2 shared cores through the engine
(benchmarks/media_backends.py, alternating runs), took 62-69 CPU ms per 224 px JPEG
against 71-76 on torch at 8 images x 4 clients in every run, and served more images/s in
8 of 9 paired rounds (benchmarks/results/2026-12-01-cpu-media-onnx.md). SigLIP stays on
torch: at base size (224 px, 16 px patches) the two were within the noise, ORT's
optimizer not fusing its vision attention. CLAP, ColPali and ColQwen2 have no ONNX path.

LLM rerankers (Qwen3-Reranker, mxbai-rerank-v2, bge-reranker-v2-gemma) go to torch on
every device: their prompts run to 8,192 tokens, and the exported graph's unfused attention
holds a [heads, T, T] score matrix per layer (4.3 GB at 8,192 tokens for Qwen3-Reranker-0.6B's
16 heads, per input) where torch's SDPA kernel does not. ``--backend onnx`` serves them too,
and ``--dtype int8`` goes there on a CPU as for any family onnx runs (torch has no int8).
Which backends a family can run, and which one auto takes on a CPU, is the family's
(``ember.families``): auto never picks a backend the family cannot run.

The decision is made without importing torch or onnxruntime (``find_spec`` and device
nodes only), so choosing costs nothing on the fast path it picks. If the onnx build or
load then fails (an architecture the exporter cannot trace, an unwritable cache), the
loader falls back to torch and says so (``ember.backends.load_backend``).
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

import ember.backends.artifacts as artifacts
from ember.backends.registry import REGISTRY
from ember.installed import installed
from ember.models.spec import ResolvedModel

AUTO = "auto"
CPU_ONNX_DTYPES = ("auto", "float32", "int8")


@dataclass(frozen=True)
class Choice:
    backend: str
    reason: str
    device: str | None = None  # pinned device, where the reason decided it
    exported: bool = False  # an `ember export` directory: no fallback makes sense
    shipped: bool = False  # the folder's own OpenVINO IR: nothing else serves it as shipped
    only: bool = False  # the one backend that runs the model's family: no fallback either


def accelerator_visible() -> str | None:
    """The accelerator ``--device auto`` would give torch, found without importing it.

    Device nodes, not driver directories (a CPU-only container on a GPU node sees
    /proc/driver/nvidia but no /dev/nvidiaN), and an empty or "-1" CUDA_VISIBLE_DEVICES
    hides them as it does from torch.
    """
    if sys.platform == "darwin":
        return "mps" if platform.machine() == "arm64" else None
    if os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1"):
        return None
    dev = Path("/dev")
    if any(dev.glob("nvidia[0-9]*")):
        return "cuda"
    if (dev / "kfd").exists():  # ROCm: torch calls it cuda too
        return "rocm"
    if (dev / "dxg").exists():  # WSL2's GPU bridge
        return "cuda (WSL2)"
    return None


def onnxruntime_installed() -> bool:
    """ONNX Runtime, which serves a graph; building one needs the onnx package too
    (``onnx_export.require_onnx``), which a slim image leaves out."""
    return installed("onnxruntime")


# What a torch-free install adds to serve graphs on a CPU (pyproject's `cpu` extra).
CPU_EXTRA = "pip install 'ember[cpu]'"


def exported_backend(path: Path) -> str | None:
    """The backend whose ``ember export`` wrote the directory ``path``, if one did."""
    for entry in REGISTRY.values():
        if entry.exporter is not None:
            manifest = artifacts.read_manifest(Path(path) / entry.export_subdir) or {}
            if manifest.get("backend") == entry.name:
                return entry.name
    return None


def choose_backend(model: ResolvedModel, accelerator: str | None = None) -> Choice:
    """What serves ``model``, whose settings ask for ``auto``, and the reason in words.

    ``accelerator`` names the device the model will be served on where it is not visible
    yet (a platform snapshotting memory before its GPU is attached); None looks at this
    machine. A backend that runs the family only on a condition the model's files fail
    (``Family.conditions``) is never the choice: torch is, where it runs the model, else
    the refusal says why.
    """
    choice = _choose(model, accelerator)
    family = model.family
    unmet = family.unmet(model, choice.backend)
    if unmet is None:
        return choice
    pinned = choice.exported or choice.only or choice.backend == "torch"
    if pinned or not family.runs_on("torch") or family.unmet(model, "torch") is not None:
        family.require_condition(model, choice.backend)  # raises: the condition is unmet
    reason = f"{choice.backend} runs {family.name} models only with {unmet.words}"
    return Choice("torch", reason)


def _choose(model: ResolvedModel, accelerator: str | None) -> Choice:
    """The choice by family, device, dtype and what is installed."""
    runtime = model.runtime
    if exported := exported_backend(model.path):
        reason = f"the directory is an `ember export --backend {exported}` artifact"
        return Choice(exported, reason, exported=True)
    family = model.family
    if parts := model.facts.parts:  # a model made of parts: what its networks run on
        networks = [m for m in parts if not m.family.only_backend]
        return choose_backend((networks or list(parts))[0], accelerator)
    if only := family.only_backend:
        device = "cpu" if REGISTRY[only].cpu_only else None
        return Choice(only, f"{family.name} models run on {only}", device, only=True)
    int8_on_onnx = runtime.dtype == "int8" and family.runs_on("onnx")  # torch has no int8
    if not family.runs_on("onnx") or (family.cpu_backend == "torch" and not int8_on_onnx):
        return Choice("torch", f"{family.name} models run on torch (see ember.backends.choice)")
    if runtime.device not in ("auto", "cpu"):
        return Choice("torch", f"--device {runtime.device}")
    if runtime.device == "auto" and (accelerator := accelerator or accelerator_visible()):
        return Choice("torch", f"a {accelerator} device is visible")
    if runtime.dtype not in CPU_ONNX_DTYPES:
        return Choice("torch", f"--dtype {runtime.dtype} has no ONNX Runtime CPU path")
    if runtime.torch_compile:
        return Choice("torch", "--torch-compile asked for")
    if runtime.trust_remote_code:
        return Choice("torch", "remote-code models may not export to ONNX")
    from ember.backends.openvino_backend import ir_choice

    if runtime.dtype != "int8" and (ir := ir_choice(model)) is not None:
        where = ir.relative_to(model.path)
        reason = f"the model ships an OpenVINO IR ({where}) and no ONNX graph"
        return Choice("openvino", reason, device="cpu", shipped=True)
    if not onnxruntime_installed():
        return Choice("torch", f"onnxruntime is not installed ({CPU_EXTRA})")
    if runtime.dtype == "int8":
        return int8_choice(model)
    # Pinned: onnxruntime-gpu lists its CUDA provider even where no GPU is attached.
    return Choice("onnx", "CPU with onnxruntime installed", device="cpu")


def int8_choice(model: ResolvedModel) -> Choice:
    """``--dtype int8`` on a CPU, the fast tier: OpenVINO with int8 weights and activations
    quantised as it runs where the CPU has int8 dot-product units and the model is a text
    embedder or classifier (``openvino_int8``: 2,048-sentence worst cosine 0.995 for
    MiniLM, every matmul int8), at bf16 on AMX, where that is the faster
    (``openvino_int8.slower_than_bf16``); else ONNX Runtime's dynamic int8 (``onnx_int8``:
    exact integer kernels on AVX2 too)."""
    from ember.backends.openvino_backend import INT8, serves
    from ember.backends.openvino_int8 import slower_than_bf16

    if why_not := serves(model, INT8):
        return Choice("onnx", f"--dtype int8 on a CPU: onnx dynamic int8 ({why_not})", "cpu")
    if why_bf16 := slower_than_bf16():
        return Choice("openvino", f"--dtype int8 on a CPU with AMX: bfloat16, as {why_bf16}", "cpu")
    return Choice("openvino", "--dtype int8 on a CPU with int8 dot-product units", "cpu")
