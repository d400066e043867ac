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

import sys

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


def split(value: str) -> list[str]:
    return [part.strip() for part in value.split(";")]


def bake(model_ids: str, revisions: str = "") -> list[str]:
    """Download each ``;``-separated id (at the matching revision); return the paths."""
    from huggingface_hub import snapshot_download

    ids = [i for i in split(model_ids) if i]
    revs = split(revisions)
    paths = []
    for n, model_id in enumerate(ids):
        revision = revs[n] if n < len(revs) and revs[n] else None
        path = snapshot_download(model_id, revision=revision, allow_patterns=HUB_PATTERNS)
        print(f"baked {model_id}@{revision or 'main'} at {path}", flush=True)
        paths.append(path)
    return paths


if __name__ == "__main__":
    bake(*(sys.argv[1:3]))
