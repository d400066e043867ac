"""Numbers match the references: sentence-transformers, CrossEncoder, transformers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ember.engine import SyncEngineArray
from ember.engine.batcher import PADDING_CPU
from tests.texts import mixed_texts

TEXTS = mixed_texts(60)


@pytest.fixture(scope="module")
def engine(minilm_path: Path, tiny_reranker_path: Path, tiny_classifier_path: Path):
    """auto's backend on its exact path (``dtype="float32"``): the references' float32
    tolerances hold on any CPU kind. The near-exact default (bf16 where the CPU has it and
    the probe holds) is held to its own bar in tests/integration/test_near_exact_serving.py."""
    with SyncEngineArray(
        model_id=[str(minilm_path), str(tiny_reranker_path), str(tiny_classifier_path)],
        served_model_name=["minilm", "reranker", "classifier"],
        device="cpu",
        dtype="float32",
        max_batch_size="16",
    ) as ember:
        yield ember


def test_embeddings_match_sentence_transformers(engine: SyncEngineArray, minilm_path: Path):
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_path), device="cpu").encode(
        TEXTS, batch_size=8, convert_to_numpy=True
    )
    ours = engine.embed(TEXTS, model="minilm")
    # No --backend: the backend auto chose here, on its exact path.
    minilm = engine.engines.get("minilm")
    assert minilm.backend.info.details["chosen"].startswith("auto: ")
    declared = getattr(minilm.backend, "padding", None)  # onnx on CPU declares its own
    assert minilm.batcher.padding == (declared or PADDING_CPU)
    assert ours.shape == reference.shape == (len(TEXTS), 384)
    cosine = (ours * reference).sum(1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1)
    )
    worst = int(np.argmin(cosine))
    assert cosine.min() >= 0.9999, f"text {worst} {TEXTS[worst][:40]!r}: cosine {cosine[worst]}"
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_same_text_same_vector_in_any_batch(engine: SyncEngineArray):
    probe = TEXTS[3]
    alone = engine.embed([probe], model="minilm")[0]
    with_short = engine.embed(["x", probe, "y z"], model="minilm")[1]
    with_long = engine.embed([TEXTS[19], probe, *TEXTS[40:50]], model="minilm")[1]
    assert np.abs(alone - with_short).max() <= 1e-5
    assert np.abs(alone - with_long).max() <= 1e-5


def test_rerank_matches_cross_encoder(engine: SyncEngineArray, tiny_reranker_path: Path):
    from sentence_transformers import CrossEncoder

    query = "what is a dense retriever?"
    docs = TEXTS[:20]
    ce = CrossEncoder(str(tiny_reranker_path), device="cpu", max_length=512)
    raw_ref = ce.predict([(query, d) for d in docs], activation_fn=torch.nn.Identity())
    raw = engine.rerank(query, docs, model="reranker", raw_scores=True)
    np.testing.assert_allclose(raw, raw_ref, atol=1e-4)
    scores = engine.rerank(query, docs, model="reranker")
    np.testing.assert_allclose(scores, torch.sigmoid(torch.tensor(raw_ref)).numpy(), atol=1e-5)


def test_rerank_follows_a_saved_identity_activation(tiny_reranker_path: Path, tmp_path: Path):
    """A CrossEncoder saved with activation_fn Identity (config_sentence_transformers.json,
    as sentence-transformers 6.2 writes it): predict's scores are the raw logits, and so
    is relevance_score here, on every backend auto might pick (on its exact path)."""
    from sentence_transformers import CrossEncoder

    saved = CrossEncoder(str(tiny_reranker_path), device="cpu", activation_fn=torch.nn.Identity())
    saved.save_pretrained(str(tmp_path / "identity"))
    reference = CrossEncoder(str(tmp_path / "identity"), device="cpu")
    assert isinstance(reference.activation_fn, torch.nn.Identity)
    query, docs = "what is a dense retriever?", TEXTS[:8]
    expected = reference.predict([(query, d) for d in docs])
    assert (expected < 0).any() or (expected > 1).any()  # not a probability: raw logits
    identity = str(tmp_path / "identity")
    with SyncEngineArray(model_id=identity, device="cpu", dtype="float32") as ember:
        scores = ember.rerank(query, docs)
        raw = ember.rerank(query, docs, raw_scores=True)
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    np.testing.assert_allclose(raw, expected, atol=1e-4)


def test_classify_matches_transformers_pipeline(
    engine: SyncEngineArray, tiny_classifier_path: Path
):
    from transformers import pipeline

    pipe = pipeline(
        "text-classification", model=str(tiny_classifier_path), top_k=None, device="cpu"
    )
    texts = TEXTS[:12]
    reference = pipe(texts, truncation=True)
    ours = engine.classify(texts, model="classifier")
    assert len(ours) == len(reference)
    for got, want in zip(ours, reference, strict=True):
        assert [g["label"] for g in got] == [w["label"] for w in want]
        np.testing.assert_allclose([g["score"] for g in got], [w["score"] for w in want], atol=1e-5)
