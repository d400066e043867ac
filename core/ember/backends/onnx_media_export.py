"""ONNX artifacts for dual encoders (CLIP, SigLIP): each tower exported as its own graph.

Pipeline at first load, cached under ``artifacts.artifact_dir`` like the text graphs
(``onnx_export``); later loads open the cached graphs directly:

1. ``torch.onnx.export`` (TorchScript exporter, eager attention, as ``onnx_export``) of
   ``get_text_features`` and ``get_image_features`` separately, so a text request never
   runs the vision weights and each graph is fused and quantised for its own shapes:
   ``text.onnx`` takes what the model's tokenizer returns (``input_ids``, plus
   ``attention_mask`` where it returns one: CLIP does, SigLIP does not), dynamic batch and
   sequence; ``vision.onnx`` takes ``pixel_values`` at the processor's size, dynamic
   batch. Both return the projected embedding (``embeddings``, [batch, dim]), as
   transformers does, not normalised.
2. ``onnxruntime.transformers.optimizer`` with model_type ``clip`` (fusions only,
   hardware independent): attention, QuickGelu/FastGelu and skip-LayerNorm where it
   recognises them. A graph it cannot fuse is kept unfused (the session still applies
   ``ORT_ENABLE_ALL``).
3. ``--dtype int8``: dynamic quantisation of each fused tower with ``onnx_int8``'s rule
   (per-channel int8 weights on the MatMuls fed by attention context or an FFN
   activation, first layer fp32), derived from the fp32 artifact.
"""

from __future__ import annotations

import logging
import tempfile
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import ember.backends.artifacts as artifacts
import ember.backends.isolated as isolated
from ember.backends.onnx_export import (
    OPSET,
    WEIGHT_SUFFIXES,
    Plan,
    Progress,
    resolve_device,
)
from ember.backends.onnx_int8 import int8_scheme, quantize_int8
from ember.errors import ConfigError
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

BACKEND = "onnx"
# Bump when export/optimise/quantise changes what it writes: old caches miss.
FORMAT_VERSION = 1
OPT_MODEL_TYPE = "clip"
OPT_LEVEL = 0  # offline: graph fusions only; the session adds hardware-specific rewrites
OUTPUT = "embeddings"
# The graph file and the config section of each tower, by the modality it serves.
TOWER_FILES = {"text": "text.onnx", "image": "vision.onnx"}
TOWER_CONFIGS = {"text": "text_config", "image": "vision_config"}
# Token arrays a text graph may take, in the order the tower's signature lists them.
TEXT_INPUTS = ("input_ids", "attention_mask")
# Kinds whose towers export: one transformers tower per modality, no remote code. CLAP's
# HTSAT audio tower (windowed attention with data-dependent padding) is left to torch.
# Above this many bytes of weights (both towers) each graph keeps its weights in a ``.data``
# file beside it: protobuf caps a graph at 2 GiB, and one tower of a large model passes it.
EXTERNAL_DATA_BYTES = 1_800_000_000


def media_plan(model: ResolvedModel, available: list[str]) -> Plan:
    """Device and dtype of the towers' sessions: float32 (CPU or CUDA) or int8 (CPU).

    No float16 graphs: ORT's fp16 conversion is not checked against transformers for these
    towers; a GPU in fp16 is served by ``--backend torch``.
    """
    kind = model.family.name
    if not model.family.runs_on("onnx"):
        raise ConfigError(
            f"model {model.served_name!r} is a {kind} model, served by --backend "
            f"{' or '.join(model.family.backends)} (not onnx)"
        )
    device = resolve_device(model.runtime.device, available)
    dtype = "float32" if model.runtime.dtype == "auto" else model.runtime.dtype
    if dtype == "int8" and device != "cpu":
        raise ConfigError("--dtype int8 (dynamic quantisation) runs on --device cpu only")
    if dtype not in ("float32", "int8"):
        raise ConfigError(
            f"the onnx backend serves {kind} towers in float32 or int8 (cpu), not {dtype!r}; "
            "--backend torch serves float16 and bfloat16"
        )
    if device == "cpu":
        return Plan(device, dtype, ["CPUExecutionProvider"])
    return Plan(device, dtype, ["CUDAExecutionProvider", "CPUExecutionProvider"])


def build_options(model: ResolvedModel, plan: Plan) -> dict[str, Any]:
    """Everything that changes the artifacts; hashed into the cache key."""
    return {
        "format": FORMAT_VERSION,
        "towers": TOWER_FILES,
        "opset": OPSET,
        "optimizer": f"{OPT_MODEL_TYPE}@{OPT_LEVEL}",
        "dtype": plan.dtype,
        "int8": int8_scheme(plan.int8_weights) if plan.dtype == "int8" else None,
        "versions": artifacts.package_versions(["torch", "transformers", "onnx", "onnxruntime"]),
    }


# ---------------------------------------------------------------- export


def is_large(model: ResolvedModel) -> bool:
    """Whether the graphs are written with external data (``EXTERNAL_DATA_BYTES``)."""
    size = sum(p.stat().st_size for p in model.path.glob("*") if p.suffix in WEIGHT_SUFFIXES)
    return size > EXTERNAL_DATA_BYTES


def _load_net(model: ResolvedModel) -> Any:
    import torch
    from transformers import AutoModel

    net = AutoModel.from_pretrained(
        str(model.path), dtype=torch.float32, attn_implementation="eager"
    )
    return net.eval()


def _embedding(out: Any) -> Any:
    """transformers 5 returns the projected embedding as ``pooler_output``; 4.x a tensor."""
    return getattr(out, "pooler_output", out)


def export_towers(model: ResolvedModel, dst: Path) -> dict[str, Path]:
    """Export each tower of ``model`` to ``dst`` (fp32); returns the file per modality.

    The dummy inputs come from the model's own processor, so the graph's input names,
    dtypes and image size are what ``MediaProcessor`` will feed it.
    """
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoProcessor

    net = _load_net(model)
    processor = AutoProcessor.from_pretrained(str(model.path))
    returned = set(processor.tokenizer.model_input_names)
    names = [n for n in TEXT_INPUTS if n in returned]
    tokens = processor.tokenizer(
        ["a photo of a cat on a mat", "x"], padding=True, return_tensors="pt"
    )
    image = Image.fromarray(np.full((240, 320, 3), 128, dtype=np.uint8), "RGB")
    pixels = processor.image_processor(images=[image, image], return_tensors="pt")

    class Text(torch.nn.Module):
        """Positional token arrays -> the projected text embedding."""

        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return _embedding(self.net.get_text_features(**dict(zip(names, inputs, strict=True))))

    class Vision(torch.nn.Module):
        """Pixel values -> the projected image embedding."""

        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return _embedding(self.net.get_image_features(pixel_values=pixel_values))

    text_axes = {n: {0: "batch", 1: "sequence"} for n in names}
    jobs = {
        "text": (Text(), tuple(tokens[n] for n in names), text_axes),
        "image": (Vision(), (pixels["pixel_values"].float(),), {"pixel_values": {0: "batch"}}),
    }
    files = {}
    for modality, (module, dummy, axes) in jobs.items():
        file = dst / f"exported-{TOWER_FILES[modality]}"
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            # What the tracer warns about holds for every input served: the image-size check
            # (the processor's size is the graph's), the mask's padding check (the mask is as
            # long as the ids) and CLIP's eos gather (indices from argmax, never negative).
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message=".*aten::index.*", category=UserWarning)
            torch.onnx.export(
                module,
                dummy,
                str(file),
                dynamo=False,
                input_names=list(axes),
                output_names=[OUTPUT],
                dynamic_axes={**axes, OUTPUT: {0: "batch"}},
                opset_version=OPSET,
                do_constant_folding=True,
            )
        files[modality] = file
    return files


def optimize_tower(model: ResolvedModel, modality: str, src: Path, dst: Path) -> dict[str, int]:
    """ORT's fusions for one tower; a graph the optimizer rejects is kept as exported."""
    import onnx
    from onnxruntime.transformers import optimizer

    section = model.config.get(TOWER_CONFIGS[modality]) or {}
    try:
        opt = optimizer.optimize_model(
            str(src),
            model_type=OPT_MODEL_TYPE,
            num_heads=int(section.get("num_attention_heads") or 0),
            hidden_size=int(section.get("hidden_size") or 0),
            opt_level=OPT_LEVEL,
        )
        opt.save_model_to_file(str(dst), use_external_data_format=is_large(model))
    except Exception as exc:
        log.warning("ORT optimizer failed on the %s tower (%s); kept unfused", modality, exc)
        onnx.save_model(
            onnx.load(str(src)),
            str(dst),
            save_as_external_data=is_large(model),
            location=dst.name + ".data",
        )
        return {}
    return {k: int(v) for k, v in opt.get_fused_operator_statistics().items() if v}


def _build(
    model: ResolvedModel, plan: Plan, out_dir: Path, say: Progress, fp32_dir: Path | None
) -> dict[str, Any]:
    """Write each tower's graph (+ manifest) to ``out_dir``; returns the manifest.

    ``fp32_dir``: the fused fp32 artifact to quantise (int8); None: export and fuse.
    """
    started = time.monotonic()
    fused: dict[str, dict[str, int]] = {}
    quantized: dict[str, int] = {}
    if fp32_dir is not None:
        fused = (artifacts.read_manifest(fp32_dir) or {}).get("fused_ops", {})
        for modality, name in TOWER_FILES.items():
            say(f"quantising the {modality} tower to int8 (dynamic, per-channel)")
            quantized[modality] = quantize_int8(
                fp32_dir / name, out_dir / name, plan.int8_weights, is_large(model)
            )
    else:
        with tempfile.TemporaryDirectory(prefix="ember-onnx-media-") as tmp_name:
            say(f"exporting the towers of {model.path} to ONNX (opset {OPSET})")
            exported = export_towers(model, Path(tmp_name))
            for modality, src in exported.items():
                say(f"fusing the {modality} tower with onnxruntime.transformers.optimizer")
                fused[modality] = optimize_tower(
                    model, modality, src, out_dir / TOWER_FILES[modality]
                )
    manifest = {
        "backend": BACKEND,
        "kind": model.family.name,
        "towers": TOWER_FILES,
        "dtype": plan.dtype,
        "device": plan.device,
        "fused_ops": fused,
        "int8_nodes": quantized,
        "source": str(model.path),
        "options": build_options(model, plan),
    }
    artifacts.write_manifest(out_dir, manifest)
    seconds = time.monotonic() - started
    say(f"wrote {out_dir} in {seconds:.1f} s (fused: {fused}, int8 nodes: {quantized})")
    return manifest


def prepare(model: ResolvedModel, plan: Plan, progress: Progress | None = None) -> Path:
    """The cached directory holding every tower's graph, built on first load.

    int8 is derived from the fp32 artifact (built first if missing), so switching dtypes
    never exports twice.
    """
    say = progress or log.info
    target = artifacts.artifact_dir(model, BACKEND, build_options(model, plan))
    if artifacts.read_manifest(target) is not None and all(
        (target / name).is_file() for name in TOWER_FILES.values()
    ):
        log.info("using cached ONNX towers %s", target)
        return target
    fp32_dir = None
    if plan.dtype == "int8":
        fp32_dir = prepare(model, replace(plan, dtype="float32"), progress)
    say(f"building ONNX towers for {model.served_name} in {target} (first load only)")
    with artifacts.staging(target) as tmp:
        isolated.run(_build, model, plan, tmp, say, fp32_dir)
    return target
