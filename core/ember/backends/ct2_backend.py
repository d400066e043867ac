"""CTranslate2 backend: a converted encoder; token states, or its classification head in numpy.

At first load the HF model is converted with ``ctranslate2.converters.TransformersConverter``
into the artifact cache (one directory per compute type, weights stored in that type
so loading does no conversion). CTranslate2's ``Encoder`` returns token states and,
for BERT, ``pooler_output`` (dense + tanh on [CLS]); it has no sequence-classification
head, so the head's weights are saved next to the model (``head.npz``, float32) and
applied here in numpy:

- BERT: ``classifier(pooler_output)``
- RoBERTa / XLM-R / CamemBERT: ``out_proj(tanh(dense(h[CLS])))``
- DistilBERT: ``classifier(relu(pre_classifier(h[CLS])))``

Compute types: float32, int8 (``int8_float32`` on CPU, ``int8_float16`` on CUDA),
float16 (CUDA), bfloat16 where the device supports it. An unsupported type is an error,
never a silent fallback to another precision.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import ember.backends.artifacts as artifacts
import ember.backends.isolated as isolated
from ember.backends.base import BackendDefaults, BackendInfo
from ember.backends.registry import REGISTRY
from ember.batch import LOGITS, TOKEN_STATES, Outputs, TokenBatch
from ember.cpu import cpu_forward_plan, physical_cores
from ember.errors import ConfigError, MissingDependency
from ember.models.spec import ResolvedModel

log = logging.getLogger(__name__)

MISSING = "the ct2 backend needs CTranslate2: pip install 'ember[ct2]'"
BACKEND = "ct2"
HEAD_FILE = "head.npz"
SUBDIR = REGISTRY[BACKEND].export_subdir  # inside an `ember export` directory
FORMAT_VERSION = 1
Progress = Callable[[str], None]

# HF classification-head parameter names per model_type, and how they are applied.
HEADS: dict[str, tuple[str, dict[str, str]]] = {
    "bert": ("pooler", {"out_w": "classifier.weight", "out_b": "classifier.bias"}),
    "roberta": (
        "dense_tanh",
        {
            "dense_w": "classifier.dense.weight",
            "dense_b": "classifier.dense.bias",
            "out_w": "classifier.out_proj.weight",
            "out_b": "classifier.out_proj.bias",
        },
    ),
    "distilbert": (
        "dense_relu",
        {
            "dense_w": "pre_classifier.weight",
            "dense_b": "pre_classifier.bias",
            "out_w": "classifier.weight",
            "out_b": "classifier.bias",
        },
    ),
}
HEADS["xlm-roberta"] = HEADS["roberta"]
HEADS["camembert"] = HEADS["roberta"]


# The model types CTranslate2's converter turns into an ``Encoder``; it converts decoders
# (Qwen3, Mistral, Llama, ...) too, but into a ``Generator``, which ``Encoder`` refuses.
ENCODER_TYPES = ("bert", "distilbert", "roberta", "xlm-roberta", "camembert")


def check_runs(model: ResolvedModel) -> None:
    """Refuse at start, before any conversion, a model ct2 cannot run as an encoder: a
    decoder converts, then fails to load with a traceback."""
    if model.model_type in ENCODER_TYPES:
        return
    family = f"{model.architecture} ({model.model_type or '?'})"
    what = "a decoder" if _is_decoder(model) else "an encoder ct2 does not convert"
    raise ConfigError(
        f"model {model.served_name!r} is {what}, {family}: ct2 runs encoders "
        f"({', '.join(ENCODER_TYPES)}); use --backend torch or onnx"
    )


def _is_decoder(model: ResolvedModel) -> bool:
    """A causal LM by transformers' own tables (BERT and RoBERTa have causal-LM heads too,
    so a decoder is one with a causal-LM class and no masked-LM class)."""
    if model.config.get("is_decoder") or model.architecture.endswith("ForCausalLM"):
        return True
    try:
        from transformers.models.auto import modeling_auto as auto
    except ImportError:
        return False
    causal, masked = auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    return model.model_type in causal and model.model_type not in masked


def _import_ct2() -> Any:
    try:
        import ctranslate2
    except ImportError as exc:
        raise MissingDependency(MISSING) from exc
    return ctranslate2


# ---------------------------------------------------------------- options


@dataclass(frozen=True)
class Plan:
    device: str  # "cpu" | "cuda"
    compute_type: str  # a CTranslate2 compute type, e.g. "int8_float32"


def plan_for(model: ResolvedModel, ct2: Any) -> Plan:
    """Map --device/--dtype to a CTranslate2 device and a compute type it supports."""
    device = model.runtime.device
    cuda = ct2.get_cuda_device_count() > 0
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    elif device == "cuda" and not cuda:
        raise ConfigError("--device cuda asked for, but CTranslate2 sees no CUDA device")
    elif device not in ("cpu", "cuda"):
        raise ConfigError(f"the ct2 backend runs on cpu or cuda, not {device!r}")
    dtype = model.runtime.dtype
    exported = (_export_manifest(model) or {}).get("compute_type")
    if dtype == "auto" and exported:  # an `ember export` directory serves as exported
        dtype = compute = str(exported)
    else:
        if dtype == "auto":
            dtype = "float16" if device == "cuda" else "float32"
        mapping = {
            "float32": "float32",
            "float16": "float16",
            "bfloat16": "bfloat16",
            "int8": "int8_float16" if device == "cuda" else "int8_float32",
        }
        if dtype not in mapping:
            raise ConfigError(
                f"the ct2 backend serves float32/float16/bfloat16/int8, not {dtype!r}"
            )
        compute = mapping[dtype]
    supported = set(ct2.get_supported_compute_types(device))
    if compute not in supported:
        raise ConfigError(
            f"--dtype {dtype} needs CTranslate2 compute type {compute!r}, which this "
            f"{device} and CTranslate2 {ct2.__version__} build do not support "
            f"(supported: {', '.join(sorted(supported))}); pick one of those"
        )
    return Plan(device, compute)


def build_options(plan: Plan) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "quantization": plan.compute_type,
        "versions": artifacts.package_versions(["ctranslate2", "transformers", "torch"]),
    }


# ---------------------------------------------------------------- conversion


def _converter_class(ct2: Any) -> type:
    class Converter(ct2.converters.TransformersConverter):
        """Fills config fields that transformers 5 no longer writes but the loaders read."""

        def load_model(self, model_class: Any, path: str, **kwargs: Any) -> Any:
            net = super().load_model(model_class, path, **kwargs)
            if not hasattr(net.config, "position_embedding_type"):
                net.config.position_embedding_type = "absolute"
            return net

    return Converter


def _head_kind(model: ResolvedModel) -> str | None:
    if model.backbone == "encoder":
        return None
    if model.model_type not in HEADS:
        raise ConfigError(
            f"the ct2 backend has no {model.model_type!r} classification head; it serves "
            f"rerank/classify for {', '.join(sorted(HEADS))} (or use --backend torch/onnx)"
        )
    return HEADS[model.model_type][0]


def save_head(model: ResolvedModel, dst: Path) -> None:
    """Copy the classification head's weights out of the HF checkpoint as float32."""
    import torch
    from transformers import AutoModelForSequenceClassification

    names = HEADS[model.model_type][1]
    net = AutoModelForSequenceClassification.from_pretrained(
        str(model.path), dtype=torch.float32, trust_remote_code=model.runtime.trust_remote_code
    )
    state = net.state_dict()
    missing = [v for v in names.values() if v not in state]
    if missing:
        raise ConfigError(f"{model.path}: classification head weights {missing} not found")
    arrays = {k: state[v].detach().float().numpy() for k, v in names.items()}
    np.savez(dst / HEAD_FILE, **arrays)


def convert(model: ResolvedModel, plan: Plan, out_dir: Path, say: Progress) -> dict[str, Any]:
    """Convert into ``out_dir`` (model.bin, config, vocabulary, head.npz, manifest)."""
    ct2 = _import_ct2()
    started = time.monotonic()
    kind = _head_kind(model)
    roberta_like = model.model_type in ("roberta", "xlm-roberta", "camembert")
    if roberta_like and model.config.get("pad_token_id") == 0:
        # its loader skips the position offset when padding_idx is 0: shifted positions
        raise ConfigError(
            f"CTranslate2 converts {model.model_type} models with pad_token_id 0 "
            "with wrong position embeddings; serve this model with --backend onnx or torch"
        )
    say(f"converting {model.path} to CTranslate2 ({plan.compute_type})")
    converter = _converter_class(ct2)(
        str(model.path), trust_remote_code=model.runtime.trust_remote_code
    )
    try:
        converter.convert(str(out_dir), quantization=plan.compute_type, force=True)
    except (ValueError, NotImplementedError, AssertionError) as exc:
        raise ConfigError(f"CTranslate2 cannot convert {model.path}: {exc}") from exc
    if kind is not None:
        save_head(model, out_dir)
    manifest = {
        "backend": BACKEND,
        "task": model.task,
        "compute_type": plan.compute_type,
        "head": kind,
        "source": str(model.path),
        "options": build_options(plan),
    }
    artifacts.write_manifest(out_dir, manifest)
    seconds = time.monotonic() - started
    say(f"converted ({plan.compute_type}, head: {kind}) in {seconds:.1f} s")
    return manifest


def _is_ct2_dir(path: Path) -> bool:
    return (path / "model.bin").is_file() and (path / "config.json").is_file()


def _export_manifest(model: ResolvedModel) -> dict[str, Any] | None:
    """The manifest of the ``ember export`` model under ``model.path``, if there is one."""
    exported = model.path / SUBDIR
    manifest = artifacts.read_manifest(exported)
    if manifest and manifest.get("backend") == BACKEND and _is_ct2_dir(exported):
        return manifest
    return None


def export(model: ResolvedModel, out_dir: Path, progress: Progress | None = None) -> Path:
    """``ember export --backend ct2``: a directory that ``--model-id`` serves directly.

    The HF config, tokenizer and sentence-transformers files stay at the top (model
    resolution reads them); the CTranslate2 model goes to ``ct2/`` because it has a
    ``config.json`` of its own.
    """
    check_runs(model)
    ct2 = _import_ct2()
    plan = plan_for(model, ct2)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts.copy_model_files(model.path, out_dir, exclude=[SUBDIR])
    artifacts.write_pooling_files(model, out_dir)
    target = out_dir / SUBDIR
    if target.exists():
        shutil.rmtree(target)
    with artifacts.staging(target) as tmp:
        convert(model, plan, tmp, progress or log.info)
    return out_dir


def prepare(model: ResolvedModel, plan: Plan, progress: Progress | None = None) -> Path:
    """The CTranslate2 directory to load: an ``ember export`` one, else the cache."""
    say = progress or log.info
    exported = model.path / SUBDIR
    manifest = _export_manifest(model)
    if manifest:
        if manifest.get("compute_type") == plan.compute_type:
            return exported
        if not any(model.path.glob("*.safetensors")) and not any(model.path.glob("*.bin")):
            raise ConfigError(
                f"{exported} was exported for {manifest.get('compute_type')} and holds no HF "
                f"weights to convert for {plan.compute_type}; export again with that --dtype"
            )
        log.info(
            "%s was exported for %s; converting for %s into the cache",
            exported,
            manifest.get("compute_type"),
            plan.compute_type,
        )
    target = artifacts.artifact_dir(model, BACKEND, build_options(plan))
    if artifacts.read_manifest(target) is not None and _is_ct2_dir(target):
        log.info("using cached CTranslate2 artifact %s", target)
        return target
    say(f"converting {model.served_name} for CTranslate2 into {target} (first load only)")
    with artifacts.staging(target) as tmp:
        isolated.run(convert, model, plan, tmp, say)
    return target


# ---------------------------------------------------------------- runtime


class Ct2Backend(BackendDefaults):
    """A ``ctranslate2.Encoder``; heads and pooling run in numpy on its outputs.

    It takes lengths, not an attention mask: positions past a row's length are padding
    to it, so a masked query expansion (ColBERT) has no token states here.
    """

    masked_positions = False

    def __init__(self, model: ResolvedModel, path: Path, plan: Plan) -> None:
        ct2 = _import_ct2()
        self._ct2 = ct2
        # CPU: one single-threaded replica per core, fed concurrently by the batcher's
        # workers (ember.cpu.cpu_forward_plan); GPU: one replica.
        self.parallel_forwards, threads = 1, 0
        if plan.device == "cpu":
            self.parallel_forwards, threads = cpu_forward_plan(
                model.runtime.forward_workers, physical_cores()
            )
        try:
            self.encoder = ct2.Encoder(
                str(path),
                device=plan.device,
                compute_type=plan.compute_type,
                intra_threads=threads,
                inter_threads=self.parallel_forwards,
            )
        except ValueError as exc:  # e.g. compute type refused by this CPU
            raise ConfigError(f"CTranslate2 cannot load {path}: {exc}") from exc
        self.encoder_only = model.backbone == "encoder"
        self.device = plan.device
        self.path = path  # the artifact loaded (info shows it relative to the cache)
        self.kind = _head_kind(model)
        self.head: dict[str, np.ndarray] = {}
        if self.kind is not None:
            with np.load(path / HEAD_FILE) as data:
                self.head = {k: data[k] for k in data.files}
        # DistilBERT has no segment embeddings; every other supported encoder does.
        self.token_types = model.model_type != "distilbert"
        self.info = BackendInfo(
            name=BACKEND,
            device=plan.device,
            dtype=plan.compute_type,
            details={
                "artifact": artifacts.shown_path(path, model),
                "ctranslate2": ct2.__version__,
                "threads": f"{self.parallel_forwards}x{threads}",
            },
        )

    def _numpy(self, view: Any) -> np.ndarray:
        if self.device != "cpu":
            view = view.to_device(self._ct2.Device.cpu)
        return np.asarray(view, dtype=np.float32)

    def forward(self, batch: TokenBatch) -> Outputs:
        ct2 = self._ct2
        ids = np.ascontiguousarray(batch.input_ids, dtype=np.int32)
        lengths = batch.attention_mask.sum(axis=1).astype(np.int32)
        types = batch.token_type_ids.tolist() if self.token_types else None
        out = self.encoder.forward_batch(
            ct2.StorageView.from_array(ids), ct2.StorageView.from_array(lengths), types
        )
        if self.encoder_only:
            return {TOKEN_STATES: self._numpy(out.last_hidden_state)}
        return {LOGITS: self._logits(out)}

    def _logits(self, out: Any) -> np.ndarray:
        h = self.head
        if self.kind == "pooler":
            if out.pooler_output is None:
                raise ConfigError("the converted BERT model has no pooler; re-export it")
            x = self._numpy(out.pooler_output)
        else:
            cls = self._numpy(out.last_hidden_state)[:, 0, :]
            x = cls @ h["dense_w"].T + h["dense_b"]
            x = np.tanh(x) if self.kind == "dense_tanh" else np.maximum(x, 0)
        return np.ascontiguousarray(x @ h["out_w"].T + h["out_b"], dtype=np.float32)

    def close(self) -> None:
        self.encoder = None


def load(model: ResolvedModel) -> Ct2Backend:
    check_runs(model)
    ct2 = _import_ct2()
    plan = plan_for(model, ct2)
    return Ct2Backend(model, prepare(model, plan), plan)
