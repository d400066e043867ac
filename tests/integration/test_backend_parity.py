"""Every CPU backend through the whole engine (tokenizer, batcher, tasks) against the
references, each with its stated tolerance: the same checks the torch path passes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from ember.engine import SyncEngineArray
from tests.texts import mixed_texts

TEXTS = mixed_texts(50)
QUERY = "what is a dense retriever?"

# Stated tolerances per (backend, dtype): worst and mean cosine of the MiniLM embeddings vs
# sentence-transformers fp32; for the tiny random rerankers/classifiers, logit atol (fp32) or
# rank correlation and probability atol (int8, where random weights make int8 noise large).
CASES = [
    # backend, dtype, worst cos, mean cos, logit atol, rerank corr, prob atol
    ("torch", "float32", 0.9999, 0.9999, 1e-4, None, 1e-4),
    ("onnx", "float32", 0.9999, 0.9999, 1e-4, None, 1e-4),
    ("ct2", "float32", 0.9999, 0.9999, 1e-4, None, 1e-4),
    # ORT dynamic int8 on attention-out/FFN-out MatMuls only (see onnx_int8).
    ("onnx", "int8", 0.99, 0.995, None, 0.98, 0.05),
    # CTranslate2 int8_float32 quantises every linear layer; the worst texts are
    # near-empty ones (whitespace only -> [CLS][SEP]).
    ("ct2", "int8", 0.96, 0.99, None, 0.9, 0.15),
]


@pytest.fixture(scope="module")
def references(minilm_path: Path, tiny_reranker_path: Path, tiny_classifier_path: Path) -> dict:
    from sentence_transformers import CrossEncoder, SentenceTransformer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    st = SentenceTransformer(str(minilm_path), device="cpu")
    ce = CrossEncoder(str(tiny_reranker_path), device="cpu", max_length=512)
    tok = AutoTokenizer.from_pretrained(str(tiny_classifier_path))
    clf = AutoModelForSequenceClassification.from_pretrained(str(tiny_classifier_path)).eval()
    with torch.inference_mode():
        logits = clf(**tok(TEXTS[:12], padding=True, truncation=True, return_tensors="pt")).logits
    return {
        "embed": st.encode(TEXTS, batch_size=16),
        "rerank": ce.predict([(QUERY, d) for d in TEXTS[:20]], activation_fn=torch.nn.Identity()),
        "classify": torch.softmax(logits, -1).numpy(),
    }


@pytest.fixture(scope="module", params=CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def case(
    request: pytest.FixtureRequest,
    minilm_path: Path,
    tiny_reranker_path: Path,
    tiny_classifier_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[SyncEngineArray, tuple]]:
    backend, dtype = request.param[:2]
    with SyncEngineArray(
        model_id=[str(minilm_path), str(tiny_reranker_path), str(tiny_classifier_path)],
        served_model_name=["minilm", "reranker", "classifier"],
        backend=backend,
        dtype=dtype,
        device="cpu",
        cache_dir=str(tmp_path_factory.mktemp(f"cache-{backend}-{dtype}")),
        max_batch_tokens="2048",
    ) as ember:
        yield ember, request.param[2:]


def test_embeddings(case: tuple, references: dict) -> None:
    ember, (worst, mean, *_) = case
    ours = ember.embed(TEXTS, model="minilm")
    ref = references["embed"]
    cos = (ours * ref).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= worst, f"worst cosine {cos.min():.5f} on {TEXTS[int(cos.argmin())]!r}"
    assert cos.mean() >= mean


def test_rerank(case: tuple, references: dict) -> None:
    ember, (_, _, atol, corr, _) = case
    raw = np.array(ember.rerank(QUERY, TEXTS[:20], model="reranker", raw_scores=True))
    ref = references["rerank"]
    if atol is not None:
        np.testing.assert_allclose(raw, ref, atol=atol)
    else:  # quantised: the ranking is what a reranker is for
        assert np.corrcoef(raw, ref)[0, 1] >= corr


def test_classify(case: tuple, references: dict) -> None:
    ember, (*_, prob_atol) = case
    labels = ember.classify(TEXTS[:12], model="classifier")
    order = ["negative", "neutral", "positive"]
    probs = np.array(
        [[{e["label"]: e["score"] for e in row}[name] for name in order] for row in labels]
    )
    np.testing.assert_allclose(probs, references["classify"], atol=prob_atol)
