"""The int8 fast tier (``--dtype int8`` on a CPU): which runtime the flag selects, and its
tolerance, worst cosine >= 0.99 against fp32 sentence-transformers over the WHOLE anchor
corpus (benchmarks/corpus.py, 2,048 sentences), not a handful of texts.

The CPU kind is forced through the reader the chooser calls (``ember.cpu.int8_dot_product``);
the loads are real (NNCF quantises the tiny model's ONNX graph, OpenVINO runs it), so the
tolerance holds on whatever x86 host runs the tests. Speed is the benchmarks' to measure.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.corpus import N_SENTENCES, make_sentences
from ember import cpu
from ember.backends import choice, openvino_int8
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec, ResolvedModel
from tests.fixtures.tiny_models import build_tiny_embedder

pytest.importorskip("openvino")
pytest.importorskip("nncf")

FAST_TIER_COSINE = 0.99


@pytest.fixture(scope="module")
def tiny_mean_embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_embedder(tmp_path_factory.mktemp("tiny-fast"), seed=31, pooling="mean")


@pytest.fixture
def cpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """No accelerator and onnxruntime present, whatever this machine has."""
    monkeypatch.setattr(choice, "accelerator_visible", lambda: None)
    monkeypatch.setattr(choice, "onnxruntime_installed", lambda: True)


def _model(path: Path, cache: Path, **spec: object) -> ResolvedModel:
    return resolve_model(ModelSpec(model_id=str(path), device="cpu", cache_dir=cache, **spec))  # type: ignore[arg-type]


@pytest.mark.usefixtures("cpu_host")
@pytest.mark.parametrize(
    ("unit", "bf16", "backend", "words"),
    [
        ("vnni", None, "openvino", "with int8 dot-product units"),
        ("vnni", "avx512_bf16", "openvino", "with int8 dot-product units"),
        ("vnni", "amx", "openvino", "with AMX: bfloat16, as bf16 on its AMX tiles outruns int8"),
        ("x86", None, "onnx", "onnx dynamic int8"),
    ],
)
def test_dtype_int8_selects_the_fast_runtime_for_the_cpu(
    tiny_mean_embedder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    unit: str,
    bf16: str | None,
    backend: str,
    words: str,
) -> None:
    """One flag: ``--dtype int8`` goes to OpenVINO's int8 where the CPU has int8 dot-product
    units, to OpenVINO's bf16 where it has AMX (faster there than int8: the reason says so),
    and to ONNX Runtime's dynamic int8 (exact integer kernels) where it has neither."""
    monkeypatch.setattr(cpu, "int8_dot_product", lambda: unit)
    monkeypatch.setattr(cpu, "native_bf16", lambda: bf16)
    chosen = choice.choose_backend(_model(tiny_mean_embedder, tmp_path, dtype="int8"))
    assert (chosen.backend, chosen.device) == (backend, "cpu"), chosen.reason
    assert chosen.reason.startswith("--dtype int8 on a CPU")
    assert words in chosen.reason
    exact = choice.choose_backend(_model(tiny_mean_embedder, tmp_path, dtype="float32"))
    assert exact.backend == "onnx"  # the flag is what selects the tier


@pytest.mark.usefixtures("cpu_host")
@pytest.mark.parametrize(("bf16", "dtype"), [(None, "int8"), ("amx", "bfloat16")])
def test_the_fast_tier_holds_its_tolerance_over_the_whole_anchor_corpus(
    tiny_mean_embedder: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bf16: str | None,
    dtype: str,
) -> None:
    """Served through the engine as a user gets it (`--dtype int8`), on a CPU with VNNI
    (the int8 graph) and on one with AMX (bf16), every one of the 2,048 corpus sentences
    within cosine 0.99 of fp32 sentence-transformers."""
    from sentence_transformers import SentenceTransformer

    from ember.engine import SyncEngineArray

    # Read before forcing: the kernels OpenVINO picks follow the host, not the readers.
    host_has_vnni = cpu.int8_dot_product() == "vnni"
    host_bf16 = cpu.native_bf16()
    host_has_amx = host_bf16 == "amx"
    monkeypatch.setattr(cpu, "int8_dot_product", lambda: "vnni")
    monkeypatch.setattr(cpu, "native_bf16", lambda: bf16)
    texts = make_sentences(N_SENTENCES)
    reference = SentenceTransformer(str(tiny_mean_embedder), device="cpu").encode(
        texts, batch_size=64, convert_to_numpy=True
    )
    with SyncEngineArray(
        model_id=[str(tiny_mean_embedder)], device="cpu", dtype=["int8"], cache_dir=str(tmp_path)
    ) as ember:
        backend = ember.engines.engines[0].backend
        info = backend.info  # type: ignore[union-attr]
        assert (info.name, info.dtype) == ("openvino", dtype)
        assert "auto: --dtype int8 on a CPU with " in info.details["chosen"]
        compiled = backend.compiled  # type: ignore[union-attr]
        if dtype == "bfloat16":
            # asked for bf16; OpenVINO computes it only where the host has the units (the
            # AMX here is faked), f32 elsewhere
            hint = compiled.get_property("INFERENCE_PRECISION_HINT").to_string()
            assert hint == ("bf16" if host_bf16 else "f32")
        else:
            group = compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")
            assert group == openvino_int8.ACTIVATION_GROUP
        if dtype == "int8" and host_has_vnni and not host_has_amx:
            # Where the int8 graph really runs: every matmul int8, not widened to bf16 (on
            # AMX OpenVINO widens them: why the tier serves bf16 there).
            matmuls = [
                op.get_rt_info()["runtimePrecision"].astype(str)
                for op in compiled.get_runtime_model().get_ordered_ops()
                if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"
            ]
            assert matmuls and set(matmuls) == {"i8"}, matmuls
        got = np.asarray(ember.embed(texts), dtype=np.float64)
    ref = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    cos = (got / np.linalg.norm(got, axis=1, keepdims=True) * ref).sum(axis=1)
    assert len(cos) == N_SENTENCES
    assert cos.min() >= FAST_TIER_COSINE, f"worst {cos.min():.5f} at {int(cos.argmin())}"
