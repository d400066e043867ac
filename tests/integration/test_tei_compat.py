"""TEI's compatibility routes on a real `ember serve`: Hugging Face's `InferenceClient`
against the server root, and `/similarity`, `/decode`, `/tokenize` without `model`."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient, constants

from tests.conftest import API_KEY
from tests.support import ServerProcess

TEXTS = ["The cat sat on the mat.", "A dog slept on the rug.", "Stocks fell sharply today."]


@pytest.fixture(scope="module")
def reference(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


@pytest.fixture()
def hf(server: ServerProcess, monkeypatch: pytest.MonkeyPatch) -> InferenceClient:
    # The tests run with HF_HUB_OFFLINE=1, which makes huggingface_hub refuse every request,
    # this loopback server's too; lift it for this client's calls only (a URL as `model`
    # with a token never reaches the Hub).
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return InferenceClient(model=server.url, token=API_KEY, timeout=60)


@pytest.fixture()
def http(server: ServerProcess):
    with server.client() as client:
        yield client


def test_feature_extraction(hf: InferenceClient, reference) -> None:
    got = hf.feature_extraction(TEXTS[0])
    assert got.shape == (1, 384) and got.dtype == np.float32
    want = reference.encode([TEXTS[0]], normalize_embeddings=True)
    np.testing.assert_allclose(got, want, atol=1e-4)
    # its TEI parameters reach /embed: a Matryoshka cut, then re-normalised
    cut = hf.feature_extraction(TEXTS[0], dimensions=32)
    head = want[0, :32] / np.linalg.norm(want[0, :32])
    assert cut.shape == (1, 32)
    np.testing.assert_allclose(cut[0], head, atol=1e-4)


def test_sentence_similarity(hf: InferenceClient, reference) -> None:
    got = hf.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    vectors = reference.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(got, vectors[1:] @ vectors[0], atol=1e-4)
    assert got[0] > got[1]  # the two animal sentences are the closer pair


def test_text_classification(hf: InferenceClient, http: httpx.Client) -> None:
    predicted = http.post("/predict", json={"model": "classifier", "inputs": "good"}).json()
    got = hf.text_classification("good")
    assert [(e.label, round(e.score, 5)) for e in got] == [
        (p["label"], round(p["score"], 5)) for p in predicted
    ]
    top = hf.text_classification("good", top_k=1, function_to_apply="sigmoid")
    assert len(top) == 1 and top[0].label == predicted[0]["label"]
    raw = http.post(
        "/predict", json={"model": "classifier", "inputs": "good", "raw_scores": True}
    ).json()
    assert top[0].score == pytest.approx(1 / (1 + np.exp(-raw[0]["score"])), abs=1e-6)


def test_root_dispatch_by_body_and_kind(http: httpx.Client) -> None:
    """Without InferenceClient: the TEI bodies `/` takes, and what each answers."""
    rerank = {"query": "what sat on the mat?", "texts": TEXTS[:2]}
    assert http.post("/", json=rerank).json() == http.post("/rerank", json=rerank).json()
    plain = http.post("/", json={"inputs": TEXTS[:2]}).json()  # several served: the embedder
    np.testing.assert_allclose(
        plain, http.post("/embed", json={"model": "minilm", "inputs": TEXTS[:2]}).json(), atol=1e-6
    )
    predict = {"model": "classifier", "inputs": ["good", "bad"]}
    assert http.post("/", json=predict).json() == http.post("/predict", json=predict).json()
    pair = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    np.testing.assert_allclose(
        http.post("/", json=pair).json(), http.post("/similarity", json=pair).json(), atol=1e-6
    )


def test_similarity_route(http: httpx.Client, reference) -> None:
    body = {
        "inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS},
        "parameters": {"truncate": True, "truncation_direction": "Right"},
    }
    response = http.post("/similarity", json=body)
    assert response.status_code == 200 and "x-total-time" in response.headers
    scores = response.json()
    assert len(scores) == 3 and scores[0] == pytest.approx(1.0, abs=1e-5)
    vectors = reference.encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(scores, vectors @ vectors[0], atol=1e-4)


def test_tokenize_and_decode_without_model(http: httpx.Client, reference) -> None:
    """Several models served: both go to the first (MiniLM)."""
    tokens = http.post("/tokenize", json={"inputs": "hello world"}).json()
    named = http.post("/tokenize", json={"model": "minilm", "inputs": "hello world"}).json()
    assert tokens == named
    ids = [t["id"] for t in tokens[0]]
    assert ids == reference.tokenizer("hello world")["input_ids"]
    assert http.post("/decode", json={"ids": ids}).json() == ["hello world"]
    kept = http.post("/decode", json={"ids": [ids, ids[1:2]], "skip_special_tokens": False})
    assert kept.json() == [reference.tokenizer.decode(ids), "hello"]
    other = http.post("/decode", json={"model": "reranker", "ids": [1, 2, 3]})
    assert other.status_code == 200 and isinstance(other.json()[0], str)


def test_errors(http: httpx.Client) -> None:
    cases = [
        # a bad body: 422
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 422),
        ("/decode", {"ids": []}, 422),
        ("/decode", {"ids": [-1]}, 422),
        ("/", {"texts": ["a"]}, 422),
        ("/", {"nonsense": 1}, 422),
        ("/", {"inputs": "a", "parameters": {"top_k": 0}}, 422),
        # a model that cannot do the asked thing, or an id outside the vocabulary: 400
        (
            "/similarity",
            {"model": "classifier", "inputs": {"source_sentence": "a", "sentences": ["b"]}},
            400,
        ),
        ("/", {"model": "reranker", "inputs": "a"}, 400),
        ("/", {"model": "minilm", "query": "q", "texts": ["a"]}, 400),
        ("/decode", {"model": "minilm", "ids": [10**7]}, 400),
        # an unknown model: 404
        ("/decode", {"model": "nope", "ids": [1]}, 404),
    ]
    for path, body, status in cases:
        response = http.post(path, json=body)
        assert response.status_code == status, (path, body, response.text)
        error = response.json()["error"]
        assert error["code"] == status and error["message"], error
    too_many = {"inputs": {"source_sentence": "a", "sentences": ["b"] * 64}}
    assert http.post("/similarity", json=too_many).status_code == 413  # 65 texts over 64


def test_colbert_decode_is_its_tokenizers(tmp_path) -> None:
    """ColBERT's processor decodes as its tokenizer does (PyLate's [Q]/[D] markers are
    ordinary added tokens, so they stay in the text)."""
    from transformers import AutoTokenizer

    from ember.families.resolve import resolve_model
    from ember.models.spec import ModelSpec
    from ember.processors import build_processor
    from tests.fixtures.retrieval_models import build_tiny_colbert

    model = resolve_model(ModelSpec(model_id=str(build_tiny_colbert(tmp_path / "colbert"))))
    processor = build_processor(model)
    reference = AutoTokenizer.from_pretrained(str(model.path))
    ids = processor.encode(["hello world"])[0].ids  # [CLS] [D] hello world [SEP]
    for skip in (True, False):
        got = processor.decode([ids], skip_special_tokens=skip)  # type: ignore[attr-defined]
        assert got == [reference.decode(ids, skip_special_tokens=skip)]
    assert "hello world" in got[0]
