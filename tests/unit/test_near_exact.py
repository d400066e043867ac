"""auto's near-exact path (ember.backends.near_exact): bf16 on a CPU that multiplies it
natively, kept only where a fixed probe set holds to float32; float32 everywhere else.

The CPU kind is forced both ways through the reader the chooser calls
(``ember.cpu.native_bf16``), and every load is real: the fp32 onnx graph and OpenVINO's
bf16 compilation of it (which runs in float32 on a CPU without bf16, so these tests hold
on any x86 host)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from ember import cpu
from ember.backends import artifacts, choice, load_backend, near_exact
from ember.backends.base import Backend
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec, ResolvedModel


@pytest.fixture
def cpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """No accelerator and onnxruntime present, whatever this machine has."""
    monkeypatch.setattr(choice, "accelerator_visible", lambda: None)
    monkeypatch.setattr(choice, "onnxruntime_installed", lambda: True)


def _forced(monkeypatch: pytest.MonkeyPatch, unit: str | None) -> None:
    monkeypatch.setattr(cpu, "native_bf16", lambda: unit)


def _minilm(cache: Path, **spec: object) -> ResolvedModel:
    return resolve_model(ModelSpec(model_id="", device="cpu", cache_dir=cache, **spec))  # type: ignore[arg-type]


def _load(model: ResolvedModel) -> tuple[str, str, str]:
    backend = load_backend(model)
    try:
        return backend.info.name, backend.info.dtype, backend.info.details["chosen"]
    finally:
        backend.close()


def test_the_probe_set_is_fixed_and_of_mixed_length() -> None:
    texts = near_exact.probe_texts()
    assert texts == near_exact.probe_texts() and len(texts) >= 64
    words = sorted(len(t.split()) for t in texts)
    assert words[0] <= 10 and words[-1] >= 200  # one sentence up to past 256 tokens
    assert len(near_exact.probe_pairs()) == len(texts)


@pytest.mark.usefixtures("cpu_host")
def test_a_bf16_cpu_serves_the_near_exact_path_where_the_probe_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forced(monkeypatch, "avx512_bf16")
    name, dtype, chosen = _load(_minilm(tmp_path))
    assert (name, dtype) == ("openvino", "bfloat16"), chosen
    assert chosen.startswith("auto: CPU with onnxruntime installed; near-exact openvino ")
    # the cosine is the host's: where the unit is only faked (no bf16 on this CPU),
    # OpenVINO computes in f32 and the probe reports 1.000000
    assert re.search(r"this CPU has avx512_bf16; worst cosine (0\.99\d*|1\.000000) >=", chosen)
    assert chosen.endswith(">= 0.9999 to float32 on 64 probe inputs, checked now)")


@pytest.mark.usefixtures("cpu_host")
def test_a_cpu_without_native_bf16_keeps_float32_and_checks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forced(monkeypatch, None)
    monkeypatch.setattr(near_exact, "load_candidate", _never)
    name, dtype, chosen = _load(_minilm(tmp_path))
    assert (name, dtype) == ("onnx", "float32")
    assert chosen.endswith("; float32 (this CPU has no native bf16 (AVX512-BF16 or AMX))")
    assert not (tmp_path / "near-exact").exists()


@pytest.mark.usefixtures("cpu_host")
def test_dtype_float32_forces_the_exact_path_on_a_bf16_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forced(monkeypatch, "amx")
    monkeypatch.setattr(near_exact, "load_candidate", _never)
    name, dtype, chosen = _load(_minilm(tmp_path, dtype="float32"))
    assert (name, dtype) == ("onnx", "float32")
    assert chosen.endswith("; float32 (--dtype float32 asked for: the exact path)")


@pytest.mark.usefixtures("cpu_host")
def test_a_probe_that_misses_the_bar_keeps_float32_and_the_verdict_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bar is injected above any cosine, so the real comparison must fail it."""
    _forced(monkeypatch, "avx512_bf16")
    monkeypatch.setattr(near_exact, "COSINE_FLOOR", 1.0 + 1e-9)
    name, dtype, chosen = _load(_minilm(tmp_path))
    assert (name, dtype) == ("onnx", "float32")
    assert re.search(
        r"; float32 kept \(openvino bfloat16 on avx512_bf16: worst cosine (0\.99\d*|1\.000000) <",
        chosen,
    )
    assert chosen.endswith("< 1.000000001 to float32 on 64 probe inputs, checked now)")
    # Next start: the cached verdict decides, and the candidate is not even loaded.
    monkeypatch.setattr(near_exact, "load_candidate", _never)
    again = _load(_minilm(tmp_path))
    assert again[:2] == ("onnx", "float32")
    assert again[2].endswith("on 64 probe inputs, cached decision)")


@pytest.mark.usefixtures("cpu_host")
def test_a_passed_verdict_is_cached_per_cpu_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forced(monkeypatch, "avx512_bf16")
    assert _load(_minilm(tmp_path))[0] == "openvino"
    (decided,) = (tmp_path / "near-exact").iterdir()
    manifest = artifacts.read_manifest(decided) or {}
    assert manifest["passed"] is True and manifest["cpu"] == "avx512_bf16"
    assert manifest["metric"] == "cosine" and manifest["inputs"] == "64"

    def no_probe(*_: object) -> object:
        raise AssertionError("a cached verdict was checked again")

    monkeypatch.setattr(near_exact, "compare", no_probe)
    name, _, chosen = _load(_minilm(tmp_path))
    assert name == "openvino" and chosen.endswith("cached decision)")
    # Another CPU kind is another decision: checked anew, in a directory of its own.
    monkeypatch.undo()
    monkeypatch.setattr(choice, "accelerator_visible", lambda: None)
    _forced(monkeypatch, "amx")
    assert _load(_minilm(tmp_path))[2].endswith("checked now)")
    assert len(list((tmp_path / "near-exact").iterdir())) == 2


@pytest.mark.usefixtures("cpu_host")
def test_a_reranker_is_probed_on_its_activated_scores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_reranker_path: Path
) -> None:
    _forced(monkeypatch, "avx512_bf16")
    model = resolve_model(
        ModelSpec(model_id=str(tiny_reranker_path), device="cpu", cache_dir=tmp_path)
    )
    name, _, chosen = _load(model)
    assert "largest score difference " in chosen and "on 64 probe inputs" in chosen
    assert (name == "openvino") == ("<= 0.001 to float32" in chosen), chosen


@pytest.mark.usefixtures("cpu_host")
def test_a_candidate_that_fails_to_load_leaves_float32_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forced(monkeypatch, "avx512_bf16")
    monkeypatch.setattr(near_exact, "load_candidate", _never)
    name, _, chosen = _load(_minilm(tmp_path))
    assert name == "onnx"
    assert chosen.endswith("; float32 (openvino bfloat16 failed: RuntimeError: not here)")


def _never(model: ResolvedModel) -> Backend:
    raise RuntimeError("not here")


def test_the_probe_images_are_fixed_and_of_mixed_size() -> None:
    images = near_exact.probe_images()
    assert len(images) >= 64 and all(i.mode == "RGB" for i in images)
    assert [i.tobytes() for i in images[:4]] == [i.tobytes() for i in near_exact.probe_images()[:4]]
    sizes = {i.size for i in images}
    assert len(sizes) >= 5 and min(w * h for w, h in sizes) < 224 * 224 < max(
        w * h for w, h in sizes
    )


@pytest.mark.usefixtures("cpu_host")
def test_towers_are_probed_on_texts_and_images(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CLIP's towers: OpenVINO over their onnx graphs where texts and images both hold.
    The bar is moved both ways, so each branch runs whatever bf16 gives on this host."""
    from tests.fixtures.media_models import build_tiny_clip

    _forced(monkeypatch, "avx512_bf16")
    spec = {"model_id": str(build_tiny_clip()), "device": "cpu", "cache_dir": tmp_path}
    monkeypatch.setattr(near_exact, "COSINE_FLOOR", 1.0 + 1e-9)
    name, _, chosen = _load(resolve_model(ModelSpec(**spec)))  # type: ignore[arg-type]
    assert name == "onnx", chosen
    assert "worst cosine " in chosen and "on 64 text and 64 image probe inputs, checked" in chosen
    monkeypatch.setattr(near_exact, "COSINE_FLOOR", -1.0)  # another floor: decided anew
    model = resolve_model(ModelSpec(**spec))  # type: ignore[arg-type]
    backend = load_backend(model)
    try:
        assert (backend.info.name, backend.info.dtype) == ("openvino", "bfloat16")
        assert backend.info.details["towers"] == "text,image"
        # It serves: the same rows, through the engine's own processor and heads.
        from ember.engine.forward import Piece, run_batch
        from ember.heads.build import build_heads
        from ember.processors import build_processor

        processor, heads = build_processor(model), build_heads(model)
        images = [processor.image_features(i) for i in near_exact.probe_images()[:3]]
        rows = run_batch(processor, backend, heads, [Piece(f, "dense") for f in images])
        assert [r.shape for r in rows] == [(16,)] * 3  # the tiny CLIP's projection width
        assert all(np.isfinite(r).all() for r in rows) and not np.allclose(rows[0], rows[1])
    finally:
        backend.close()


@pytest.mark.usefixtures("cpu_host")
def test_a_tower_family_without_an_onnx_graph_keeps_torch_float32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.fixtures.media_models import build_tiny_clap

    _forced(monkeypatch, "amx")
    monkeypatch.setattr(near_exact, "load_candidate", _never)
    model = resolve_model(ModelSpec(str(build_tiny_clap()), device="cpu", cache_dir=tmp_path))
    name, dtype, chosen = _load(model)
    assert (name, dtype) == ("torch", "float32") and chosen == "auto: clap models run on torch"
