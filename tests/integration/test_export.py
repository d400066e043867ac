"""`ember export` writes a directory that serves directly, with no conversion at start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ember.engine import SyncEngineArray
from tests.support import REPO


@pytest.mark.parametrize(
    ("backend", "dtype", "served_dtype", "min_cosine"),
    [("onnx", "float32", "float32", 0.9999), ("ct2", "float32", "float32", 0.9999),
     ("onnx", "int8", "int8", 0.99)],
)  # fmt: skip
def test_export_then_serve_from_the_artifact(
    backend: str, dtype: str, served_dtype: str, min_cosine: float, tmp_path: Path,
    minilm_path: Path,
) -> None:  # fmt: skip
    out = tmp_path / "artifact"
    done = subprocess.run(
        [sys.executable, "-m", "ember", "export", "--backend", backend, "--dtype", dtype,
         "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {out}" in done.stdout
    cache = tmp_path / "cache"
    # No --backend, no --dtype: the directory says what it is.
    with SyncEngineArray(model_id=str(out), cache_dir=str(cache), device="cpu") as ember:
        vectors = ember.embed(["exported artifacts serve the same vectors"])
        loaded = ember.engines.get(None).backend
        info = loaded.info
    assert (info.name, info.dtype.split("_")[0]) == (backend, served_dtype)
    assert info.details["chosen"].startswith(
        f"auto: the directory is an `ember export --backend {backend}`"
    )
    assert out in loaded.path.parents or loaded.path == out  # loaded from the export itself
    assert not info.details["artifact"].startswith("/")  # /v1/models names no host path
    assert not cache.exists() or not any(cache.rglob("*"))  # nothing converted at start

    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(minilm_path), device="cpu").encode(
        ["exported artifacts serve the same vectors"]
    )
    assert float((vectors * ref).sum() / np.linalg.norm(ref)) >= min_cosine


def test_export_needs_a_known_backend() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ember", "export", "--backend", "tensorflow", "--output", "/x"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert "--backend must be one of onnx|ct2|neuron for ember export" in done.stderr
