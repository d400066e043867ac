"""Download model weights into an image's Hugging Face cache, before Ember is installed.

    python bake.py "BAAI/bge-small-en-v1.5;BAAI/bge-reranker-base" "main;main"

Every platform image (RunPod's Dockerfile, Modal's image, BentoML's) runs this ahead of
Ember's code, with the model ids and revisions as its only inputs: an edit to Ember, or
to any other setting (the API key included), reuses the baked weights and the dependency
layer under them. It imports huggingface_hub only; the file patterns are the core's
(``ember.models.resolve.HUB_PATTERNS``, kept equal by tests/platforms/test_dockerfiles.py),
so serving finds every file it would have downloaded. Empty ids bake nothing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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
# Weights saved before safetensors, fetched only for a snapshot whose transformer has none.
LEGACY_WEIGHT_PATTERNS = [
    "pytorch_model.bin",
    "pytorch_model-*.bin",
    "*/pytorch_model.bin",
    "*/pytorch_model-*.bin",
]


def split(value: str) -> list[str]:
    return [part.strip() for part in value.split(";")]


def needs_legacy_weights(snapshot: Path) -> bool:
    """The core's rule (ember.models.resolve.needs_legacy_weights, kept equal by the test):
    a transformer's config.json with no safetensors beside it."""
    for config in (snapshot / "config.json", *snapshot.glob("*/config.json")):
        try:
            names_a_model = "model_type" in json.loads(config.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if names_a_model and not any(config.parent.glob("*.safetensors")):
            return True
    return False


def bake(model_ids: str, revisions: str = "") -> list[str]:
    """Download each ``;``-separated id (at the matching revision); return the paths."""
    from huggingface_hub import snapshot_download

    ids = [i for i in split(model_ids) if i]
    revs = split(revisions)
    paths = []
    for n, model_id in enumerate(ids):
        revision = revs[n] if n < len(revs) and revs[n] else None
        path = snapshot_download(model_id, revision=revision, allow_patterns=HUB_PATTERNS)
        if needs_legacy_weights(Path(path)):
            patterns = LEGACY_WEIGHT_PATTERNS
            path = snapshot_download(model_id, revision=revision, allow_patterns=patterns)
        print(f"baked {model_id}@{revision or 'main'} at {path}", flush=True)
        paths.append(path)
    return paths


if __name__ == "__main__":
    bake(*(sys.argv[1:3]))
