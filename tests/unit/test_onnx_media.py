"""The ONNX towers' decisions: which media kinds ``--backend onnx`` takes, which device and
dtype it builds, and that the towers' artifacts are cached by the model's files."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.backends import load_backend, onnx_media_export
from ember.backends.choice import Choice, choose_backend
from ember.backends.onnx_media_export import TOWER_FILES, media_plan
from ember.batch import EMBEDDINGS, FeatureBatch
from ember.errors import ConfigError
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec, ResolvedModel
from tests.fixtures.media_models import build_tiny_clap, build_tiny_clip

CPU = ["CPUExecutionProvider"]
GPU = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def _resolved(path: Path, **spec: Any) -> ResolvedModel:
    return resolve_model(ModelSpec(model_id=str(path), **spec))


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_clip(tmp_path_factory.mktemp("clip") / "clip")


@pytest.fixture(scope="module")
def clap(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_clap(tmp_path_factory.mktemp("clap") / "clap")


def test_plan_is_float32_or_int8_on_cpu(clip: Path) -> None:
    assert media_plan(_resolved(clip, backend="onnx"), CPU).dtype == "float32"
    assert media_plan(_resolved(clip, backend="onnx"), GPU).device == "cuda"
    assert media_plan(_resolved(clip, backend="onnx", dtype="int8"), CPU).dtype == "int8"
    with pytest.raises(ConfigError, match="--backend torch serves float16"):
        media_plan(_resolved(clip, backend="onnx", dtype="float16", device="cuda"), GPU)
    with pytest.raises(ConfigError, match="int8 .* cpu only"):
        media_plan(_resolved(clip, backend="onnx", dtype="int8", device="cuda"), GPU)


def test_only_clip_and_siglip_take_onnx(clip: Path, clap: Path) -> None:
    with pytest.raises(ConfigError, match=r"clap model, served by --backend torch \(not onnx\)"):
        load_backend(_resolved(clap, backend="onnx"))
    with pytest.raises(ConfigError, match=r"served by --backend torch or onnx \(not ct2\)"):
        load_backend(_resolved(clip, backend="ct2"))


def test_auto_serves_clip_like_a_text_model(clip: Path, clap: Path) -> None:
    """CLIP on a CPU gets onnx (measured faster, choice.py); on a GPU, in half precision
    or without onnxruntime, torch; CLAP always torch."""
    picked = choose_backend(_resolved(clip, device="cpu"), accelerator=None)
    assert (picked.backend, picked.device) == ("onnx", "cpu")
    assert choose_backend(_resolved(clip), accelerator="cuda").backend == "torch"
    assert choose_backend(_resolved(clip, device="cpu", dtype="bfloat16")).backend == "torch"
    picked = choose_backend(_resolved(clap, device="cpu"))
    assert picked == Choice("torch", "clap models run on torch", only=True)


def test_towers_are_cached_by_the_model_files(
    clip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "clip"
    shutil.copytree(clip, source)
    model = _resolved(source, backend="onnx", device="cpu", cache_dir=tmp_path / "cache")
    plan = media_plan(model, CPU)
    built = onnx_media_export.prepare(model, plan)
    assert sorted(p.name for p in built.iterdir() if p.suffix == ".onnx") == sorted(
        TOWER_FILES.values()
    )
    backend = load_backend(model)
    batch = FeatureBatch("image", {"pixel_values": np.zeros((2, 3, 32, 32), np.float32)})
    assert backend.forward(batch)[EMBEDDINGS].shape == (2, 16)
    assert backend.info.name == "onnx" and backend.info.details["artifact"].startswith("onnx/")

    def no_build(*args: object) -> None:
        raise AssertionError("rebuilt a cached artifact")

    monkeypatch.setattr(onnx_media_export.isolated, "run", no_build)
    assert onnx_media_export.prepare(model, plan) == built  # a second load reuses it
    monkeypatch.undo()
    config = source / "config.json"
    config.write_text(config.read_text().replace("{", '{"_note": "edited",', 1))
    edited = replace(model, config=model.config)
    assert onnx_media_export.prepare(edited, plan) != built  # new files, new key


def test_large_models_keep_weights_beside_each_graph(
    clip: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the protobuf limit each tower's weights go to a .data file beside it (forced
    here by a zero threshold): the int8 graphs too, and the vectors are the same."""
    model = _resolved(clip, backend="onnx", device="cpu", cache_dir=tmp_path / "small")
    pixels = np.random.default_rng(0).normal(size=(3, 3, 32, 32)).astype(np.float32)
    batch = FeatureBatch("image", {"pixel_values": pixels})
    want = load_backend(model).forward(batch)[EMBEDDINGS]
    monkeypatch.setattr(onnx_media_export, "EXTERNAL_DATA_BYTES", 0)
    monkeypatch.setattr(onnx_media_export.isolated, "run", lambda build, *args: build(*args))
    for dtype in ("float32", "int8"):
        large = replace(model, spec=replace(model.spec, dtype=dtype, cache_dir=tmp_path / "big"))
        built = onnx_media_export.prepare(large, media_plan(large, CPU))
        for name in TOWER_FILES.values():
            assert (built / f"{name}.data").stat().st_size > (built / name).stat().st_size
        got = load_backend(large).forward(batch)[EMBEDDINGS]
        cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cosine.min() >= (0.99999 if dtype == "float32" else 0.999), (dtype, cosine)
