"""Long documents on every embed route (issue 41), against the references.

On the shared ``server`` (MiniLM on its exact float32 path): a chunk's offsets hold its
text exactly on a corpus of CJK, emoji, combining marks and RTL text; plain chunks equal
embedding each chunk's text alone (sentence-transformers); late chunking equals
sentence-transformers' token embeddings pooled per span, within the model's length and,
past it, per window (each token from the window it is most central in, rebuilt here from
the windows' own forwards); aggregates are the token-weighted mean, the maximum or the
first chunk; TEI's and Cohere's routes take the same fields; families that cannot chunk
refuse in one line; and truncation leaves a trace (``x-ember-truncated``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support import ServerProcess

# Sentences of many scripts, with emoji (ZWJ sequences, skin tones, flags), combining
# marks, right-to-left runs and CJK with no spaces.
HARD = [
    "Café crème, naïve résumé — e\u0301 a\u0308 n\u0303 (combining marks).",
    "東京は日本の首都です。人口は約千四百万人です！",
    "中文文本没有空格也可以切分吗？可以。",
    "שלום עולם. זהו טקסט בעברית מימין לשמאל.",
    "مرحبا بالعالم. هذا نص عربي للاختبار؟ نعم.",
    "Emoji 👩\u200d👩\u200d👧\u200d👦 family, 👍🏽 thumbs, 🇫🇷 flag, 🙂🚀🔥.",
    "Mixed: English then العربية then 日本語 then עברית, all in one line.",
    "Zero\u200bwidth and non\u00a0breaking spaces; tabs\tand\nnewlines.",
]


def _doc(repeat: int) -> str:
    return " ".join(HARD * repeat)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.atleast_2d(a), np.atleast_2d(b)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def reference(minilm_path: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


def _embed(server: ServerProcess, **body: Any) -> dict:
    with server.client() as client:
        response = client.post("/v1/embeddings", json={"model": "minilm", **body})
    assert response.status_code == 200, response.text
    return response.json()


def test_offsets_hold_each_chunks_text_and_its_tokens(server: ServerProcess, reference) -> None:
    doc = _doc(3)
    tokenizer = reference.tokenizer
    for boundary in ("token", "sentence"):
        answer = _embed(
            server,
            input=[doc, HARD[5]],
            chunking={"size": 24, "overlap": 6, "boundary": boundary, "return_text": True},
        )
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        chunks = answer["data"][0]["chunks"]
        assert len(chunks) > 10
        covered = set()
        for k, chunk in enumerate(chunks):
            assert chunk["index"] == k
            text = doc[chunk["char_start"] : chunk["char_end"]]
            assert text == chunk["text"] and text.strip() == text and text
            # the characters hold exactly the tokens the chunk says it covers
            alone = tokenizer(text, add_special_tokens=False)["input_ids"]
            assert alone == ids[chunk["token_start"] : chunk["token_end"]], (boundary, k)
            assert chunk["token_end"] - chunk["token_start"] <= 24
            covered.update(range(chunk["token_start"], chunk["token_end"]))
        assert covered == set(range(len(ids)))  # every token in some chunk
        if boundary == "sentence":  # most chunks end where a sentence does
            ends = [c["text"][-1] for c in chunks[:-1]]
            assert sum(e in ".!?。！？" for e in ends) >= len(ends) // 2


def test_plain_chunks_equal_each_chunk_embedded_alone(server: ServerProcess, reference) -> None:
    doc = _doc(4)
    answer = _embed(server, input=doc, chunking={"size": 40, "overlap": 8, "return_text": True})
    item = answer["data"][0]
    texts = [c["text"] for c in item["chunks"]]
    ours = np.array([c["embedding"] for c in item["chunks"]], dtype=np.float32)
    expected = reference.encode(texts, convert_to_numpy=True)
    assert _cos(ours, expected).min() >= 0.9999
    # mean: the chunks' vectors weighted by their tokens, then the model's normalisation
    weights = np.array([c["token_end"] - c["token_start"] for c in item["chunks"]], float)
    mean = (ours * weights[:, None]).sum(0) / weights.sum()
    mean /= np.linalg.norm(mean)
    assert np.abs(np.array(item["embedding"]) - mean).max() < 1e-5
    # usage counts every token encoded: each chunk's, with its special tokens
    counted = sum(len(reference.tokenizer(t)["input_ids"]) for t in texts)
    assert answer["usage"]["prompt_tokens"] == counted


@pytest.mark.parametrize("aggregate", ["max", "first", "none"])
def test_aggregates(server: ServerProcess, aggregate: str) -> None:
    item = _embed(server, input=_doc(2), chunking={"size": 30}, aggregate=aggregate)["data"][0]
    chunks = np.array([c["embedding"] for c in item["chunks"]], dtype=np.float32)
    if aggregate == "none":
        assert item["embedding"] is None
        return
    expected = chunks.max(0) if aggregate == "max" else chunks[0]
    expected = expected / np.linalg.norm(expected)
    assert np.abs(np.array(item["embedding"]) - expected).max() < 1e-5


def _token_states(reference: Any, ids: list[int]) -> np.ndarray:
    """sentence-transformers' token embeddings of one input given as ids (its special
    tokens added): [T, H], the [CLS] first."""
    import torch

    tok = reference.tokenizer
    full = [tok.cls_token_id, *ids, tok.sep_token_id]
    features = {
        "input_ids": torch.tensor([full]),
        "attention_mask": torch.ones(1, len(full), dtype=torch.long),
        "token_type_ids": torch.zeros(1, len(full), dtype=torch.long),
    }
    with torch.no_grad():
        out = reference[0](features)  # the Transformer module: token_embeddings
    return out["token_embeddings"][0].numpy()


def _late_reference(reference: Any, ids: list[int], chunks: list[dict], width: int) -> np.ndarray:
    """Each chunk's mean over its tokens, each token's vector from the window of ``width``
    tokens whose centre is nearest it (windows a quarter-window apart in overlap, the last
    ending at the document's end), normalised as the model does."""
    n = len(ids)
    if n <= width:
        starts = [0]
    else:
        stride = width - int(width * 0.25)
        starts = list(range(0, n - width, stride)) + [n - width]
    states = {a: _token_states(reference, ids[a : a + width]) for a in starts}
    vectors = np.zeros((n, states[0].shape[1]), dtype=np.float64)
    for t in range(n):
        best = min(starts, key=lambda a: (abs(t + 0.5 - (a + width / 2)), a))
        vectors[t] = states[best][t - best + 1]  # +1: the [CLS]
    out = np.stack([vectors[c["token_start"] : c["token_end"]].mean(0) for c in chunks])
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.mark.parametrize("repeat", [1, 6], ids=["within-length", "windows"])
def test_late_chunking_equals_token_embeddings_pooled_per_span(
    server: ServerProcess, reference, repeat: int
) -> None:
    doc = _doc(repeat)
    ids = reference.tokenizer(doc, add_special_tokens=False)["input_ids"]
    width = reference.max_seq_length - 2
    assert (len(ids) <= width) == (repeat == 1)
    answer = _embed(server, input=doc, chunking={"size": 32}, late_chunking=True)
    chunks = answer["data"][0]["chunks"]
    ours = np.array([c["embedding"] for c in chunks], dtype=np.float32)
    expected = _late_reference(reference, ids, chunks, width)
    assert _cos(ours, expected).min() >= 0.9999
    if repeat > 1:  # every window's tokens were encoded, overlaps counted
        assert answer["usage"]["prompt_tokens"] > len(ids) + 2


def test_jinas_late_chunking_shape_pools_each_string(server: ServerProcess, reference) -> None:
    strings = HARD[:4]
    answer = _embed(server, input=strings, late_chunking=True)
    assert [d["index"] for d in answer["data"]] == [0, 1, 2, 3]
    assert all("chunks" not in d or d["chunks"] is None for d in answer["data"])
    joined = " ".join(strings)
    enc = reference.tokenizer(joined, add_special_tokens=False, return_offsets_mapping=True)
    starts = [a for a, _ in enc["offset_mapping"]]
    spans, at = [], 0
    for s in strings:
        first = next(i for i, a in enumerate(starts) if a >= at)
        last = next((i for i, a in enumerate(starts) if a >= at + len(s)), len(starts))
        spans.append({"token_start": first, "token_end": last})
        at += len(s) + 1
    expected = _late_reference(reference, enc["input_ids"], spans, reference.max_seq_length - 2)
    ours = np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)
    assert _cos(ours, expected).min() >= 0.9999


def test_cohere_and_tei_take_the_same_fields(server: ServerProcess, reference) -> None:
    doc = _doc(3)
    openai = _embed(server, input=doc, overflow="chunk")["data"][0]
    with server.client() as client:
        v2 = client.post(
            "/v2/embed",
            json={"model": "minilm", "texts": [doc], "overflow": "chunk"},
        )
        tei = client.post("/embed", json={"model": "minilm", "inputs": doc, "overflow": "chunk"})
        tei_chunks = client.post(
            "/embed", json={"model": "minilm", "inputs": [doc], "chunking": {"size": 50}}
        )
    assert v2.status_code == tei.status_code == tei_chunks.status_code == 200
    cohere = v2.json()
    assert np.allclose(cohere["embeddings"]["float"][0], openai["embedding"], atol=1e-6)
    assert len(cohere["chunks"][0]) == len(openai["chunks"]) > 1
    first = cohere["chunks"][0][0]
    assert np.allclose(first["embedding"]["float"], openai["chunks"][0]["embedding"], atol=1e-6)
    assert np.allclose(tei.json()[0], openai["embedding"], atol=1e-6)  # TEI's list of vectors
    item = tei_chunks.json()[0]
    assert set(item) == {"embedding", "chunks"} and len(item["chunks"]) > 1


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/embeddings", {"model": "reranker", "input": "x", "overflow": "chunk"}, "embed"),
        (
            "/v1/embeddings",
            {"model": "minilm", "input": [[101, 102]], "overflow": "chunk"},
            "token ids",
        ),
        (
            "/v1/embeddings",
            {"model": "minilm", "input": "x", "chunking": {"size": 9999}},
            "chunking size",
        ),
        (
            "/v1/embeddings",
            {"model": "minilm", "input": "x", "chunking": {"size": 8, "overlap": 8}},
            "overlap",
        ),
        ("/v1/embeddings", {"model": "minilm", "input": "x", "aggregate": "max"}, "aggregate"),
        (
            "/v1/embeddings",
            {"model": "minilm", "input": "x", "overflow": "error", "chunking": {}},
            "overflow",
        ),
        (
            "/v2/embed",
            {"model": "minilm", "texts": ["x"], "overflow": "chunk", "aggregate": "none"},
            "aggregate",
        ),
        (
            "/embed",
            {"model": "minilm", "inputs": "x", "overflow": "chunk", "aggregate": "none"},
            "aggregate",
        ),
    ],
)
def test_what_cannot_chunk_is_refused_in_one_line(
    server: ServerProcess, path: str, body: dict, words: str
) -> None:
    with server.client() as client:
        response = client.post(path, json=body)
        assert response.status_code == 400, response.text
        message = response.json()["error"]["message"]
        assert words in message and "\n" not in message
        assert client.get("/health").status_code == 200


def test_sparse_and_multi_vector_models_refuse_chunking(cache_server: ServerProcess) -> None:
    with cache_server.client() as client:
        for model in ("splade", "colbert"):
            names = client.get("/v1/models").json()["data"]
            served = next(m["id"] for m in names if model in m["id"])
            response = client.post(
                "/v1/embeddings", json={"model": served, "input": "x", "overflow": "chunk"}
            )
            assert response.status_code == 400, response.text
            assert "chunk with no clear meaning" in response.json()["error"]["message"]


def test_truncation_leaves_a_trace(server: ServerProcess) -> None:
    long = _doc(6)
    with server.client() as client:
        cut = client.post("/v1/embeddings", json={"model": "minilm", "input": [long, "short"]})
        refused = client.post(
            "/v1/embeddings", json={"model": "minilm", "input": long, "overflow": "error"}
        )
        whole = client.post("/v1/embeddings", json={"model": "minilm", "input": "short"})
        metrics = client.get("/metrics").text
    assert cut.status_code == 200 and cut.headers["x-ember-truncated"] == "1"
    assert whole.headers["x-ember-truncated"] == "0"
    assert refused.status_code == 400 and "maximum" in refused.json()["error"]["message"]
    assert 'ember_truncated_inputs_total{model="minilm"}' in metrics


def test_the_python_api_chunks_as_the_routes_do(
    server: ServerProcess, minilm_path: Path, tiny_reranker_path: Path
) -> None:
    from ember.chunking import Chunking
    from ember.engine import SyncEngineArray

    doc = _doc(2)
    routed = _embed(server, input=doc, chunking={"size": 30, "overlap": 5})["data"][0]
    with server.client() as client:
        ranked = client.post(
            "/v2/rerank",
            json={"model": "reranker", "query": "capital of Japan", "documents": [doc]}
            | {"max_tokens_per_doc": 40},
        ).json()["results"][0]
    with SyncEngineArray(
        model_id=[str(minilm_path), str(tiny_reranker_path)],
        served_model_name=["minilm", "reranker"],
        dtype="float32",
    ) as ember:
        out = ember.embed_chunks([doc], Chunking(size=30, overlap=5), model="minilm")
        scores = ember.rerank_chunks("capital of Japan", [doc], max_tokens_per_doc=40)
        plain = ember.rerank("capital of Japan", [doc], max_tokens_per_doc=40)
    spans = [(c["char_start"], c["char_end"]) for c in routed["chunks"]]
    assert [(s.char_start, s.char_end) for s in out.spans[0]] == spans
    assert _cos(out.documents[0], np.array(routed["embedding"]))[0] >= 0.9999
    assert abs(scores.values[0] - ranked["relevance_score"]) < 1e-4 and plain == [
        float(scores.values[0])
    ]
    assert scores.best[0] == ranked["chunk"]["index"]
