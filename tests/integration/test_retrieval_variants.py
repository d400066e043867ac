"""Variants of the retrieval checkpoints users have: ColBERT with attended or no query
expansion, SPLADE in sentence-transformers 5's layout, BGE-M3 in safetensors; each is
detected as its kind and matches its reference (in process, on the torch backend)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ember.engine import EmbedRequest, SyncEngineArray
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec
from tests.fixtures import references as ref
from tests.fixtures import retrieval_models as rm

TEXTS = ["Hello, world!", "Late interaction; scored token by token.", "q"]


def close(got: np.ndarray, want: np.ndarray) -> None:
    scale = max(float(np.abs(want).max()), 1e-12)
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-4 * scale


@pytest.mark.parametrize(
    ("attend", "expand"), [(True, True), (False, False)], ids=["attended", "no-expansion"]
)
def test_colbert_expansion_variants(tmp_path: Path, attend: bool, expand: bool) -> None:
    path = rm.build_tiny_colbert(
        tmp_path / "colbert", attend_to_expansion_tokens=attend, do_query_expansion=expand
    )
    assert resolve_model(ModelSpec(str(path))).family.name == "colbert"  # type: ignore[union-attr]
    backends = ["torch", "ct2"]  # nothing masked is returned here, so ct2 serves it too
    for backend in backends:
        with SyncEngineArray(model_id=str(path), backend=backend, device="cpu") as ember:
            engine = ember.engines.get(None)
            for query in (True, False):
                got = ember._call(engine.embed(EmbedRequest(TEXTS, query=query))).outputs
                for g, w in zip(got, ref.colbert_encode(path, TEXTS, query), strict=True):
                    close(g, w)


def test_splade_in_sentence_transformers_5_layout(tmp_path: Path) -> None:
    path = rm.build_tiny_splade(tmp_path / "splade", st5_layout=True)
    assert resolve_model(ModelSpec(str(path))).family.name == "splade"  # type: ignore[union-attr]
    want = ref.splade_encode(path, TEXTS)
    with SyncEngineArray(model_id=str(path), backend="torch", device="cpu") as ember:
        for got, expected in zip(ember.embed(TEXTS), want, strict=True):
            assert got.indices.tolist() == np.nonzero(expected)[0].tolist()
            close(got.values, expected[got.indices])


def test_bge_m3_in_safetensors(tmp_path: Path) -> None:
    path = rm.build_tiny_bge_m3(tmp_path / "bge", safetensors=True)
    assert resolve_model(ModelSpec(str(path))).family.name == "bge-m3"  # type: ignore[union-attr]
    want = ref.bge_m3_encode(path, TEXTS)
    with SyncEngineArray(model_id=str(path), backend="torch", device="cpu") as ember:
        close(ember.embed(TEXTS), np.stack(want["dense_vecs"]))
        engine = ember.engines.get(None)
        multi = ember._call(engine.embed(EmbedRequest(TEXTS, output="multi"))).outputs
    for g, w in zip(multi, want["colbert_vecs"], strict=True):
        close(g, w)


def test_export_refuses_a_model_whose_heads_live_beside_the_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ember.cli import main

    path = rm.build_tiny_bge_m3(tmp_path / "bge")
    out = str(tmp_path / "out")
    code = main(["export", "--model-id", str(path), "--backend", "onnx", "--output", out])
    assert code == 2
    assert "bge-m3 model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
