"""A real `ember serve` on 127.0.0.1, driven by the OpenAI SDK and httpx."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest

from ember.backends import choice
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec
from tests.conftest import API_KEY
from tests.support import ServerProcess


@pytest.fixture(scope="module")
def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)


@pytest.fixture(scope="module")
def reference(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


TEXTS = ["The cat sat on the mat.", "Embeddings map text to vectors.", "🙂 unicode ü"]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_openai_sdk_float(oai: openai.OpenAI, reference) -> None:
    response = oai.embeddings.create(model="minilm", input=TEXTS)
    assert [d.index for d in response.data] == [0, 1, 2]
    assert response.model == "minilm"
    want = reference.encode(TEXTS)
    for got, ref in zip(response.data, want, strict=True):
        assert _cos(np.array(got.embedding), ref) >= 0.9999
    assert response.usage.prompt_tokens == sum(
        len(reference.tokenizer(t)["input_ids"]) for t in TEXTS
    )


def test_openai_sdk_base64_is_little_endian_float32(oai: openai.OpenAI, server) -> None:
    floats = oai.embeddings.create(model="minilm", input=TEXTS[0]).data[0].embedding
    with server.client() as http:
        body = http.post(
            "/v1/embeddings",
            json={"model": "minilm", "input": TEXTS[0], "encoding_format": "base64"},
        ).json()
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, floats, atol=1e-6)
    # and the SDK's own base64 path decodes to the same numbers
    sdk = oai.embeddings.create(model="minilm", input=TEXTS[0], encoding_format="base64")
    np.testing.assert_allclose(
        np.array(sdk.data[0].embedding, dtype=np.float32)
        if isinstance(sdk.data[0].embedding, list)
        else np.frombuffer(base64.b64decode(sdk.data[0].embedding), "<f4"),
        floats,
        atol=1e-6,
    )


def test_openai_sdk_dimensions_truncate_and_renormalise(oai: openai.OpenAI, reference) -> None:
    response = oai.embeddings.create(model="minilm", input=TEXTS[1], dimensions=64)
    got = np.array(response.data[0].embedding)
    assert got.shape == (64,)
    assert abs(np.linalg.norm(got) - 1) < 1e-5
    full = reference.encode([TEXTS[1]])[0][:64]
    assert _cos(got, full) >= 0.9999


def test_token_id_input(server: ServerProcess, reference) -> None:
    ids = reference.tokenizer("hello world", add_special_tokens=False)["input_ids"]
    with server.client() as http:
        from_ids = http.post("/v1/embeddings", json={"model": "minilm", "input": ids}).json()
        from_text = http.post(
            "/v1/embeddings", json={"model": "minilm", "input": "hello world"}
        ).json()
        batch = http.post("/v1/embeddings", json={"model": "minilm", "input": [ids, ids]}).json()
    a = np.array(from_ids["data"][0]["embedding"])
    b = np.array(from_text["data"][0]["embedding"])
    assert _cos(a, b) >= 0.99999
    assert from_ids["usage"]["prompt_tokens"] == len(ids) + 2
    assert len(batch["data"]) == 2


def test_models_list(oai: openai.OpenAI) -> None:
    models = oai.models.list().data
    assert [m.id for m in models] == ["minilm", "reranker", "classifier"]
    # Started without --backend: each entry says what auto chose for it, and why.
    expected = choice.choose_backend(resolve_model(ModelSpec(model_id=""))).backend
    for model in models:
        extra = model.model_dump()
        assert extra["backend"] == expected and extra["dtype"] == "float32"
        assert extra["backend_details"]["chosen"].startswith("auto: ")


def test_the_exact_path_asked_for_is_reported(server: ServerProcess) -> None:
    """/v1/models and /info name the path served and why: here ``--dtype float32``, which
    keeps auto off its near-exact bf16 path on any CPU (that path's own reports:
    tests/integration/test_near_exact_serving.py)."""
    with server.client() as http:
        listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
        info = http.get("/info").json()
    minilm = listed["minilm"]
    chosen = minilm["backend_details"]["chosen"]
    assert info["backend_details"] == minilm["backend_details"]
    assert (info["backend"], info["model_dtype"]) == (minilm["backend"], minilm["dtype"])
    if minilm["backend"] == "onnx":  # auto on a CPU (else torch, on a visible accelerator)
        assert chosen.endswith("; float32 (--dtype float32 asked for: the exact path)"), chosen


def test_cohere_rerank(server: ServerProcess) -> None:
    docs = ["Paris is in France.", {"text": "Berlin is in Germany."}, "Cats purr."]
    with server.client() as http:
        for path in ("/v1/rerank", "/v2/rerank", "/rerank"):
            body = http.post(
                path,
                json={
                    "model": "reranker",
                    "query": "capital of France",
                    "documents": docs,
                    "top_n": 2,
                    "return_documents": True,
                },
            ).json()
            results = body["results"]
            assert len(results) == 2 and body["model"] == "reranker" and body["id"]
            scores = [r["relevance_score"] for r in results]
            assert scores == sorted(scores, reverse=True)
            assert all(0 <= s <= 1 for s in scores)
            texts = [d if isinstance(d, str) else d["text"] for d in docs]
            # Infinity's /rerank carries the string, Cohere's routes {"text"}
            shape = (lambda t: t) if path == "/rerank" else (lambda t: {"text": t})
            assert all(r["document"] == shape(texts[r["index"]]) for r in results)
            assert body["usage"]["prompt_tokens"] > 0
        raw = http.post(
            "/v1/rerank",
            json={"model": "reranker", "query": "q", "documents": ["a", "b"], "raw_scores": True},
        ).json()
        plain = http.post(
            "/v1/rerank", json={"model": "reranker", "query": "q", "documents": ["a", "b"]}
        ).json()
    by_index = {r["index"]: r["relevance_score"] for r in raw["results"]}
    for r in plain["results"]:
        assert abs(1 / (1 + np.exp(-by_index[r["index"]])) - r["relevance_score"]) < 1e-6


def test_tei_rerank_shape(server: ServerProcess) -> None:
    with server.client() as http:
        body = http.post(
            "/rerank", json={"query": "q", "texts": ["a", "b c", "d"], "return_text": True}
        ).json()
    assert isinstance(body, list) and len(body) == 3
    assert {r["index"] for r in body} == {0, 1, 2}
    assert [r["score"] for r in body] == sorted((r["score"] for r in body), reverse=True)
    assert all(r["text"] == ["a", "b c", "d"][r["index"]] for r in body)


def test_classify_and_predict(server: ServerProcess) -> None:
    with server.client() as http:
        body = http.post(
            "/classify", json={"model": "classifier", "input": ["good", "bad movie"]}
        ).json()
        single = http.post("/predict", json={"inputs": "good"}).json()
        many = http.post("/predict", json={"inputs": ["good", "bad movie"]}).json()
    assert body["object"] == "classify" and len(body["data"]) == 2
    labels = body["data"][0]
    assert {entry["label"] for entry in labels} == {"negative", "neutral", "positive"}
    assert abs(sum(entry["score"] for entry in labels) - 1) < 1e-6
    assert [e["label"] for e in single] == [e["label"] for e in many[0]]
    np.testing.assert_allclose(
        [e["score"] for e in single], [e["score"] for e in many[0]], atol=1e-6
    )  # padding in a bigger batch moves the 8th digit
    assert [[e["label"] for e in row] for row in many] == [
        [e["label"] for e in row] for row in body["data"]
    ]


def test_tei_embed_tokenize_info(server: ServerProcess, reference) -> None:
    with server.client() as http:
        vectors = http.post("/embed", json={"inputs": TEXTS}).json()
        raw = http.post("/embed", json={"inputs": "hi", "normalize": False}).json()
        short = http.post("/embed", json={"inputs": "hi", "dimensions": 32}).json()
        tokens = http.post("/tokenize", json={"model": "minilm", "inputs": "hello world"}).json()
        info = http.get("/info").json()
    assert np.array(vectors).shape == (3, 384)
    assert _cos(np.array(vectors[0]), reference.encode([TEXTS[0]])[0]) >= 0.9999
    assert abs(np.linalg.norm(raw[0]) - 1) > 1e-3  # not normalised on request
    assert len(short[0]) == 32
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[0][1]["start"] == 0 and tokens[0][1]["stop"] == 5
    assert info["model_id"] == "minilm" and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}


def test_operations_routes(server: ServerProcess) -> None:
    import httpx

    assert httpx.get(server.url + "/health").status_code == 200  # open without a key
    ready = httpx.get(server.url + "/ready")
    assert ready.status_code == 200 and ready.json()["models"] == [
        "minilm",
        "reranker",
        "classifier",
    ]
    with server.client() as http:
        http.post("/v1/embeddings", json={"model": "minilm", "input": "metrics please"})
    metrics = httpx.get(server.url + "/metrics").text
    for name in (
        "ember_requests_total",
        "ember_queue_depth",
        "ember_batch_size_bucket",
        "ember_batch_tokens_bucket",
        'stage="tokenize"',
        'stage="queue"',
        'stage="forward"',
    ):
        assert name in metrics, name
    assert 'route="/v1/embeddings",status="200"' in metrics
    assert 'ember_request_seconds_count{route="/v1/embeddings",status="200"}' in metrics
    assert httpx.get(server.url + "/docs").status_code == 200
    spec = httpx.get(server.url + "/openapi.json").json()
    assert {"/v1/embeddings", "/v1/rerank", "/rerank", "/embed", "/classify"} <= set(spec["paths"])


def test_timing_headers(server: ServerProcess) -> None:
    with server.client() as http:
        response = http.post("/v1/embeddings", json={"model": "minilm", "input": "timing"})
    for header in ("x-tokenization-time", "x-queue-time", "x-inference-time", "x-total-time"):
        assert float(response.headers[header]) >= 0
    assert float(response.headers["x-total-time"]) >= float(response.headers["x-inference-time"])
