"""`ember export` writes a directory that serves directly, with no conversion at start."""

from __future__ import annotations

import json
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


def _files(root: Path) -> dict[Path, bytes]:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_exports_of_one_model_are_byte_identical(
    minilm_graphs: dict[str, Path], tmp_path: Path
) -> None:
    """What the image's /models layer holds depends only on the exporter's inputs: the torch
    export and the fused `ember export` directory come out the same bytes, file for file, a
    second time (no timings in the manifest, a deterministic graph), so an edit to Ember's
    code that re-runs the export re-ships no graph."""
    from ember.backends.onnx_export import export, export_torch
    from tests.fixtures.parity import resolved

    hub = minilm_graphs["hub"]
    raw = export_torch(resolved(hub, "onnx", tmp_path / "cache"), tmp_path)
    assert raw.read_bytes() == (hub / "onnx" / "model.onnx").read_bytes()
    again = export(resolved(hub, "onnx", tmp_path / "cache"), tmp_path / "again")
    first = _files(minilm_graphs["exported"])
    assert "seconds" not in json.loads(first[Path("ember_artifact.json")])
    assert _files(again) == first
