"""ONNX Runtime backend: parity with sentence-transformers / transformers, fusion, int8, cache.

Every artifact is built once per session into a temp cache dir (session fixtures).
Tolerances: fp32 cosine >= 0.9999 per text; int8 (per-channel dynamic quantisation of
the attention-output and FFN-output MatMuls, first layer fp32) worst-case cosine >= 0.99
and mean >= 0.995 against sentence-transformers fp32 (measured 0.9930 / 0.9976); logits
of the tiny cross-encoder/classifier within 1e-4 absolute (their spread is about +-2).
"""

from __future__ import annotations

import collections
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import onnx  # noqa: E402

from ember.backends import artifacts, onnx_backend, onnx_export, onnx_int8  # noqa: E402
from ember.errors import ConfigError, MissingDependency  # noqa: E402
from tests.fixtures import parity  # noqa: E402
from tests.fixtures.tiny_models import (  # noqa: E402
    build_tiny_classifier,
    build_tiny_distilbert_classifier,
    build_tiny_embedder,
    build_tiny_reranker,
    build_tiny_roberta_classifier,
)
from tests.texts import mixed_texts  # noqa: E402

TEXTS = tuple(mixed_texts(60))


def _op_counts(path: Path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def minilm_fp32(minilm_path: Path, cache_dir: Path):
    model = parity.resolved(minilm_path, "onnx", cache_dir, dtype="float32")
    backend = onnx_backend.load(model)
    yield model, backend
    backend.close()


@pytest.fixture(scope="module")
def minilm_int8(minilm_path: Path, cache_dir: Path, minilm_fp32):
    model = parity.resolved(minilm_path, "onnx", cache_dir, dtype="int8")
    backend = onnx_backend.load(model)
    yield model, backend
    backend.close()


@pytest.fixture(scope="module")
def reference(minilm_path: Path) -> np.ndarray:
    return parity.st_embeddings(str(minilm_path), TEXTS)


def test_text_set_covers_the_hard_cases(minilm_fp32) -> None:
    model, _ = minilm_fp32
    from ember.processors.text import TextTokenizer

    counts = TextTokenizer(model).count(list(TEXTS))
    assert len(TEXTS) >= 50
    assert max(counts) > model.max_length == 256  # truncation is exercised
    assert any(not t.strip() for t in TEXTS) and any("🙂" in t for t in TEXTS)


def test_fp32_matches_sentence_transformers(minilm_fp32, reference: np.ndarray) -> None:
    model, backend = minilm_fp32
    out = parity.run_texts(backend, model, TEXTS)
    assert out.dtype == np.float32 and out.shape == (len(TEXTS), 384)
    cos = parity.cosine_rows(out, reference)
    assert cos.min() >= 0.9999, (cos.min(), TEXTS[int(cos.argmin())])
    assert backend.info.name == "onnx" and backend.info.dtype == "float32"
    assert backend.info.details["providers"].startswith("CPUExecutionProvider")


def test_cpu_batches_carry_almost_no_padding(minilm_fp32) -> None:
    """ORT computes every padded position: its CPU budget is tighter than the engine's."""
    from ember.engine.batcher import PADDING_CPU

    backend = minilm_fp32[1]
    assert backend.padding == onnx_backend.ORT_CPU_PADDING
    assert backend.padding.fraction < PADDING_CPU.fraction


def test_fp32_graph_is_fused(minilm_fp32) -> None:
    _, backend = minilm_fp32
    ops = _op_counts(backend.path)
    assert ops["Attention"] == 6  # one fused attention per layer
    assert ops["SkipLayerNormalization"] == 12
    assert ops["EmbedLayerNormalization"] == 1
    assert ops["BiasGelu"] == 6
    assert ops["Softmax"] == 0 and ops["Erf"] == 0  # nothing left unfused
    assert set(onnx_int8.int8_nodes(onnx.load(str(backend.path)))) == {
        n.name
        for n in onnx.load(str(backend.path)).graph.node
        if n.op_type == "MatMul" and ("layer.0/" not in n.name) and "intermediate" not in n.name
    }


def test_int8_within_stated_tolerance(minilm_int8, reference: np.ndarray) -> None:
    model, backend = minilm_int8
    ops = _op_counts(backend.path)
    assert ops["MatMulInteger"] == 10  # attention-output + FFN-output, layers 1..5
    assert ops["DynamicQuantizeLinear"] >= 5
    out = parity.run_texts(backend, model, TEXTS)
    cos = parity.cosine_rows(out, reference)
    assert cos.min() >= 0.99, (cos.min(), TEXTS[int(cos.argmin())])
    assert cos.mean() >= 0.995
    assert cos.mean() < 0.99999  # really quantised, not the fp32 graph under another name
    assert backend.info.dtype == "int8"


def _weight_types(path: Path) -> set[int]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return {i.data_type for i in graph.initializer if i.name.endswith("_quantized")}


def test_int8_weights_follow_the_cpu_kind(minilm_int8) -> None:
    """This host's artifact holds the weight format chosen for its CPU kind, and the
    choice follows MLAS's: uint8 on x86 without VNNI, int8 with it (and off x86)."""
    from ember.cpu import int8_dot_product

    _, backend = minilm_int8
    kind = int8_dot_product()
    want = onnx.TensorProto.UINT8 if kind == "x86" else onnx.TensorProto.INT8
    assert _weight_types(backend.path) == {want}
    if sys.platform == "linux" and kind != "other":  # numpy's CPUID probe agrees with the kernel
        flags = Path("/proc/cpuinfo").read_text().split()
        assert (kind == "vnni") == ("avx512_vnni" in flags)


def test_the_no_vnni_format_holds_the_tolerance_on_this_host(
    minilm_int8, minilm_fp32, reference: np.ndarray, tmp_path: Path, monkeypatch
) -> None:
    """The format an AVX2 host gets, built and run here. Its uint8 x uint8 kernel is exact
    integer arithmetic on every x86 kind, so these are the AVX2 host's vectors too (checked
    bit for bit under ``qemu-x86_64 -cpu Haswell``, where int8 weights lose to saturation)."""
    _, fp32 = minilm_fp32
    monkeypatch.setattr(onnx_int8, "int8_dot_product", lambda: "x86")
    assert onnx_int8.cpu_int8_weights() == "u8"
    # from the fused fp32 artifact, as an int8 build does
    assert onnx_int8.quantize_int8(fp32.path, tmp_path / "int8.onnx", "u8") == 10
    assert _weight_types(tmp_path / "int8.onnx") == {onnx.TensorProto.UINT8}
    int8_model, int8 = minilm_int8
    plan = onnx_export.plan_for(int8_model, ["CPUExecutionProvider"])
    backend = onnx_backend.OnnxBackend(int8_model, tmp_path / "int8.onnx", plan)
    try:
        cos = parity.cosine_rows(parity.run_texts(backend, int8_model, TEXTS), reference)
    finally:
        backend.close()
    assert cos.min() >= 0.99 and cos.mean() >= 0.995, (cos.min(), cos.mean())


def test_the_cache_key_names_the_weight_format(minilm_int8, monkeypatch) -> None:
    """An artifact built for one CPU kind is never opened on another."""
    model, backend = minilm_int8
    plan = onnx_export.plan_for(model, ["CPUExecutionProvider"])
    here = artifacts.artifact_dir(model, "onnx", onnx_export.build_options(model, plan))
    assert backend.path.parent == here
    assert plan.int8_weights == onnx_int8.cpu_int8_weights()
    other = replace(plan, int8_weights="s8" if plan.int8_weights == "u8" else "u8")
    assert artifacts.artifact_dir(model, "onnx", onnx_export.build_options(model, other)) != here


def test_second_load_reuses_the_cache(
    minilm_path: Path, cache_dir: Path, minilm_fp32, minilm_int8, monkeypatch
) -> None:
    paths = {"float32": minilm_fp32[1].path, "int8": minilm_int8[1].path}
    before = {k: p.stat().st_mtime_ns for k, p in paths.items()}

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("artifact rebuilt although it is cached")

    for name in ("export_torch", "optimize", "quantize_int8", "_build"):
        monkeypatch.setattr(onnx_export, name, fail)
    for dtype, path in paths.items():
        backend = onnx_backend.load(parity.resolved(minilm_path, "onnx", cache_dir, dtype))
        assert backend.path == path
        assert path.stat().st_mtime_ns == before[dtype]
        backend.close()
    assert len(list((cache_dir / "onnx").iterdir())) == 2  # no temp dirs left behind


def test_cache_key_follows_the_source_files(tmp_path: Path, cache_dir: Path) -> None:
    src = build_tiny_embedder(tmp_path / "emb")
    model = parity.resolved(src, "onnx", cache_dir)
    first = artifacts.artifact_dir(model, "onnx", {"dtype": "float32"})
    assert first == artifacts.artifact_dir(model, "onnx", {"dtype": "float32"})
    assert first != artifacts.artifact_dir(model, "onnx", {"dtype": "int8"})
    config = (src / "config.json").read_text()
    (src / "config.json").write_text(config.replace('"hidden_act"', '"hidden_act" ', 1))
    assert first != artifacts.artifact_dir(model, "onnx", {"dtype": "float32"})
    assert first.parent == cache_dir / "onnx"


def test_staging_publishes_whole_artifacts_only(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "onnx" / "m-123"
    with pytest.raises(RuntimeError), artifacts.staging(final) as tmp:
        (tmp / "model.onnx").write_text("half")
        raise RuntimeError("export failed")
    assert not final.exists() and not list(final.parent.iterdir())  # nothing half-written
    with artifacts.staging(final) as tmp:
        (tmp / "model.onnx").write_text("first")
        artifacts.write_manifest(tmp, {"backend": "onnx"})
    assert (final / "model.onnx").read_text() == "first"
    with artifacts.staging(final) as tmp:  # a concurrent loader finishing second
        (tmp / "model.onnx").write_text("second")
        artifacts.write_manifest(tmp, {"backend": "onnx"})
    assert (final / "model.onnx").read_text() == "first"
    assert [p.name for p in final.parent.iterdir()] == ["m-123"]


def test_pooling_comes_from_the_model(tmp_path: Path, cache_dir: Path) -> None:
    src = build_tiny_embedder(tmp_path / "emb-cls", pooling="cls")
    model = parity.resolved(src, "onnx", cache_dir)
    assert model.pooling == "cls"
    backend = onnx_backend.load(model)
    out = parity.run_texts(backend, model, TEXTS[:20])
    ref = parity.st_embeddings(str(src), TEXTS[:20])
    assert parity.cosine_rows(out, ref).min() >= 0.9999
    # the same graph pooled the default way would not pass: the check has teeth
    mean_model = parity.resolved(src, "onnx", cache_dir, pooling="mean")
    mean_out = parity.run_texts(onnx_backend.load(mean_model), mean_model, TEXTS[:20])
    assert parity.cosine_rows(mean_out, ref).min() < 0.99


def test_rerank_matches_cross_encoder(tmp_path: Path, cache_dir: Path) -> None:
    src = build_tiny_reranker(tmp_path / "rr")
    model = parity.resolved(src, "onnx", cache_dir)
    assert model.task == "rerank"
    pairs = parity.query_doc_pairs()
    out = parity.run_pairs(onnx_backend.load(model), model, pairs)
    ref = parity.cross_encoder_logits(str(src), tuple(pairs))
    assert out.shape == (len(pairs), 1) and out.dtype == np.float32
    assert ref.std() > 0.1  # the logits spread; equality is not trivially met
    np.testing.assert_allclose(out, ref, atol=1e-4)


def test_classify_matches_transformers(tmp_path: Path, cache_dir: Path) -> None:
    src = build_tiny_classifier(tmp_path / "cls")
    model = parity.resolved(src, "onnx", cache_dir)
    assert model.task == "classify" and model.num_labels == 3
    out = parity.run_texts(onnx_backend.load(model), model, TEXTS)
    ref = parity.hf_logits(str(src), TEXTS)
    assert out.shape == (len(TEXTS), 3)
    np.testing.assert_allclose(out, ref, atol=1e-4)
    assert (out.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize(
    "builder", [build_tiny_roberta_classifier, build_tiny_distilbert_classifier]
)
def test_other_encoders_match_transformers(builder, tmp_path: Path, cache_dir: Path) -> None:
    """RoBERTa (position offset, no pooler) and DistilBERT (no token_type_ids input)."""
    src = builder(tmp_path / "model")
    model = parity.resolved(src, "onnx", cache_dir)
    backend = onnx_backend.load(model)
    inputs = {i.name for i in backend.session.get_inputs()}
    assert ("token_type_ids" in inputs) == (model.model_type != "distilbert")
    out = parity.run_texts(backend, model, TEXTS)
    ref = parity.hf_logits(str(src), TEXTS, max_length=model.max_length)
    np.testing.assert_allclose(out, ref, atol=1e-4)


def test_model_onnx_in_the_model_dir_is_used(tmp_path: Path, cache_dir: Path) -> None:
    """A graph shipped with the model (no token_type_ids input) is optimised, not re-exported."""
    import torch
    from transformers import AutoModel

    src = build_tiny_embedder(tmp_path / "shipped", pooling="mean")
    net = AutoModel.from_pretrained(str(src), attn_implementation="eager").eval()

    class NoTypes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.net(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.tensor([[101, 7592, 102]])
    axes = {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}}
    (src / "onnx").mkdir()
    with torch.no_grad():
        torch.onnx.export(
            NoTypes(),
            (ids, torch.ones_like(ids)),
            str(src / "onnx" / "model.onnx"),
            dynamo=False,
            input_names=["input_ids", "attention_mask"],
            output_names=["last_hidden_state"],
            dynamic_axes={**axes, "last_hidden_state": {0: "b", 1: "s"}},
            opset_version=17,
        )

    def no_export(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported from torch although the model ships model.onnx")

    model = parity.resolved(src, "onnx", cache_dir)
    original = onnx_export.export_torch
    onnx_export.export_torch = no_export  # type: ignore[assignment]
    try:
        backend = onnx_backend.load(model)
    finally:
        onnx_export.export_torch = original  # type: ignore[assignment]
    assert "token_type_ids" not in {i.name for i in backend.session.get_inputs()}
    out = parity.run_texts(backend, model, TEXTS[:20])
    ref = parity.st_embeddings(str(src), TEXTS[:20])
    assert parity.cosine_rows(out, ref).min() >= 0.9999


def test_export_dir_is_servable(tmp_path: Path, cache_dir: Path) -> None:
    src = build_tiny_embedder(tmp_path / "src", pooling="cls")
    model = parity.resolved(src, "onnx", cache_dir)
    messages: list[str] = []
    out_dir = onnx_export.export(model, tmp_path / "exported", progress=messages.append)
    assert (out_dir / "model.onnx").is_file() and messages
    assert not list(out_dir.glob("*.safetensors"))  # the graph replaces the weights
    own_cache = tmp_path / "served-cache"
    served = parity.resolved(out_dir, "onnx", own_cache)
    assert served.pooling == "cls" and served.normalize
    backend = onnx_backend.load(served)
    assert backend.path == out_dir / "model.onnx"
    assert not own_cache.exists()  # served as exported, nothing rebuilt
    ref = parity.st_embeddings(str(src), TEXTS[:20])
    assert parity.cosine_rows(parity.run_texts(backend, served, TEXTS[:20]), ref).min() >= 0.9999
    # int8 from an fp32 export: quantised into the cache from the exported graph
    int8 = onnx_backend.load(parity.resolved(out_dir, "onnx", own_cache, dtype="int8"))
    assert int8.path.parent.parent == own_cache / "onnx"
    assert _op_counts(int8.path)["MatMulInteger"] > 0
    # an int8 export cannot be served as float32
    int8_dir = onnx_export.export(
        parity.resolved(src, "onnx", cache_dir, dtype="int8"), tmp_path / "exported-int8"
    )
    with pytest.raises(ConfigError, match="export again"):
        onnx_backend.load(parity.resolved(int8_dir, "onnx", own_cache, dtype="float32"))


def test_unsupported_dtype_device_is_an_error(minilm_path: Path, cache_dir: Path) -> None:
    with pytest.raises(ConfigError, match="float16"):
        onnx_backend.load(parity.resolved(minilm_path, "onnx", cache_dir, dtype="float16"))
    with pytest.raises(ConfigError, match="cuda"):
        onnx_export.resolve_device("cuda", ["CPUExecutionProvider"])
    assert onnx_export.resolve_device("auto", ["CPUExecutionProvider"]) == "cpu"


def test_missing_onnxruntime_names_the_extra(
    minilm_path: Path, cache_dir: Path, monkeypatch
) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingDependency, match=r"ember\[cpu\]"):
        onnx_backend.load(parity.resolved(minilm_path, "onnx", cache_dir))
