"""Long-document reranking (issue 41): Cohere's ``max_tokens_per_doc`` and
``max_chunks_per_doc``, the same on every rerank route.

A long document is cut into chunks of at most N of its own tokens; its score is its best
chunk's, equal (1e-4) to sentence-transformers' CrossEncoder scoring that chunk's text
alone and to Ember reranking that text alone; each answer item says where the chunk lies.
One session server (``server``: the tiny seeded cross-encoder as ``reranker``), a few small
requests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from ember.processors.chunks import Tokenised, plan
from tests.conftest import API_KEY
from tests.support import ServerProcess

QUERY = "Where do cats like to sit?"
SENTENCES = [
    "The museum opened a new wing for modern sculpture last spring.",
    "Trains to the coast leave every hour from the central station.",
    "Our cat likes to sit on the warm mat beside the kitchen window.",
    "Quarterly revenue rose by four percent despite higher costs.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Glaciers in the north have retreated for three decades.",
    "Volunteers planted three hundred trees along the river bank.",
    "The committee postponed its vote until the next session.",
]
LONG = "  ".join(SENTENCES) + " \n"  # whitespace between and after: offsets stay exact
SHORT = ["Cats like to sit on mats.", "Rain is wet."]
DOCS = [SHORT[0], LONG, SHORT[1]]
SIZE = 20  # tokens per chunk: the long document is several chunks, the short ones one


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=server.headers, timeout=60)


def _ok(server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    answer = _post(server, path, body)
    assert answer.status_code == 200, (path, answer.text)
    return answer.json()


def _by_index(results: list[dict]) -> dict[int, dict]:
    return {r["index"]: r for r in results}


@pytest.fixture(scope="module")
def cross_encoder(tiny_reranker_path: Path) -> Any:
    """sentence-transformers' CrossEncoder on the served files: sigmoid(logit) per pair,
    the Cohere routes' scale."""
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(tiny_reranker_path), device="cpu", max_length=512)

    def score(pairs: list[tuple[str, str]]) -> np.ndarray:
        logits = model.predict(pairs, activation_fn=torch.nn.Identity())
        return torch.sigmoid(torch.tensor(logits)).numpy()

    return score


@pytest.fixture(scope="module")
def tokenizer(tiny_reranker_path: Path) -> Tokenizer:
    """The served model's tokenizer, whole (its file pads and truncates)."""
    tokenizer = Tokenizer.from_file(str(tiny_reranker_path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


@pytest.fixture(scope="module")
def long_chunks(tokenizer: Tokenizer) -> list[str]:
    """The long document's chunks as the planner cuts them, from the tokenizer alone."""
    enc = tokenizer.encode(LONG, add_special_tokens=False)
    doc = Tokenised(LONG, enc.ids, enc.offsets, enc.word_ids)
    return [LONG[s.char_start : s.char_end] for s in plan(doc, SIZE)]


@pytest.fixture(scope="module")
def v2(server: ServerProcess) -> dict[str, Any]:
    answer = _post(
        server,
        "/v2/rerank",
        {"model": "reranker", "query": QUERY, "documents": DOCS, "max_tokens_per_doc": SIZE},
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-ember-truncated"] == "0"
    return _by_index(answer.json()["results"])


def test_max_tokens_per_doc_scores_the_best_chunk(
    server: ServerProcess,
    v2: dict[int, dict],
    cross_encoder: Any,
    long_chunks: list[str],
    tokenizer: Tokenizer,
) -> None:
    """The long document's score is its best chunk's, equal to the CrossEncoder scoring
    that chunk alone and to Ember reranking it alone; the chunk holds at most SIZE tokens."""
    result = v2[1]
    chunk = result["chunk"]
    text = LONG[chunk["char_start"] : chunk["char_end"]]
    assert len(long_chunks) > 3 and text == long_chunks[chunk["index"]]
    tokens = len(tokenizer.encode(text, add_special_tokens=False))
    assert tokens == chunk["token_end"] - chunk["token_start"] <= SIZE
    reference = cross_encoder([(QUERY, c) for c in long_chunks])
    assert abs(result["relevance_score"] - reference.max()) <= 1e-4
    assert int(np.argmax(reference)) == chunk["index"]
    alone = _ok(server, "/v2/rerank", {"model": "reranker", "query": QUERY, "documents": [text]})
    assert abs(result["relevance_score"] - alone["results"][0]["relevance_score"]) <= 1e-4


def test_short_documents_score_as_sent(server: ServerProcess, v2: dict[int, dict]) -> None:
    """A document within one chunk scores what it scores without the option: one chunk,
    the whole document."""
    plain = _by_index(
        _ok(server, "/v2/rerank", {"model": "reranker", "query": QUERY, "documents": DOCS})[
            "results"
        ]
    )
    for i in (0, 2):  # batched beside other lengths: float32's padding noise at most
        assert abs(v2[i]["relevance_score"] - plain[i]["relevance_score"]) <= 1e-5
        assert v2[i]["chunk"] == {
            "index": 0,
            "char_start": 0,
            "char_end": len(DOCS[i]),
            "token_start": 0,
            "token_end": v2[i]["chunk"]["token_end"],
        }
    assert all("chunk" not in r for r in plain.values())


def test_every_rerank_route_takes_the_option(server: ServerProcess, v2: dict[int, dict]) -> None:
    """Cohere v1, Infinity's and TEI's /rerank and vLLM's /score: the same scores (vLLM's
    on its own scale) and the same chunks."""
    body = {"model": "reranker", "query": QUERY, "max_tokens_per_doc": SIZE}
    for path in ("/v1/rerank", "/rerank"):
        results = _by_index(_ok(server, path, {**body, "documents": DOCS})["results"])
        for i, expected in v2.items():
            assert abs(results[i]["relevance_score"] - expected["relevance_score"]) <= 1e-6
            assert results[i]["chunk"] == expected["chunk"], path
    tei = _ok(server, "/rerank", {**body, "texts": DOCS, "return_text": True})
    for rank in tei:
        assert abs(rank["score"] - v2[rank["index"]]["relevance_score"]) <= 1e-6
        assert rank["chunk"] == v2[rank["index"]]["chunk"]
        assert rank["text"] == DOCS[rank["index"]]
    pairs = {"model": "reranker", "text_1": QUERY, "text_2": DOCS, "max_tokens_per_doc": SIZE}
    scored = _ok(server, "/score", {**pairs, "use_activation": False})["data"]
    raw = _ok(server, "/rerank", {**body, "documents": DOCS, "raw_scores": True})["results"]
    for item in scored:
        assert item["chunk"] == v2[item["index"]]["chunk"]
        assert abs(item["score"] - _by_index(raw)[item["index"]]["relevance_score"]) <= 1e-6


def test_max_chunks_per_doc_cuts_and_counts(server: ServerProcess, long_chunks: list[str]) -> None:
    """The first max_chunks_per_doc chunks are scored, the document counted as cut in
    x-ember-truncated; truncate=false refuses instead. Alone, chunks are what fits beside
    the query (the whole long document here: one chunk, nothing cut)."""
    body = {"model": "reranker", "query": QUERY, "documents": DOCS, "max_tokens_per_doc": SIZE}
    cut = _post(server, "/v1/rerank", {**body, "max_chunks_per_doc": 2})
    assert cut.status_code == 200 and cut.headers["x-ember-truncated"] == "1"
    assert _by_index(cut.json()["results"])[1]["chunk"]["index"] in (0, 1)
    refused = _post(server, "/rerank", {**body, "max_chunks_per_doc": 2, "truncate": False})
    assert refused.status_code == 400 and "max_chunks_per_doc" in refused.text
    whole = _ok(server, "/v1/rerank", {**body, "max_tokens_per_doc": None, "max_chunks_per_doc": 3})
    chunk = _by_index(whole["results"])[1]["chunk"]
    assert (chunk["index"], chunk["char_start"], chunk["char_end"]) == (0, 0, len(LONG))
    assert len(long_chunks) > 3


def test_refusals(server: ServerProcess) -> None:
    """A query that leaves no room for chunks, options below 1, and a dense model's cosine
    on /score: 400 or 422 naming the field."""
    body = {"model": "reranker", "documents": DOCS, "max_tokens_per_doc": SIZE}
    long_query = _post(server, "/v2/rerank", {**body, "query": "cats sit " * 300})
    assert long_query.status_code == 400 and "query" in long_query.json()["error"]["param"]
    for field in ("max_tokens_per_doc", "max_chunks_per_doc"):
        for bad in (0, -3, 1.5):
            answer = _post(server, "/v2/rerank", {**body, "query": QUERY, field: bad})
            assert answer.status_code == 422 and field in answer.text, (field, bad)
    cosine = {"model": "minilm", "text_1": QUERY, "text_2": DOCS, "max_chunks_per_doc": 2}
    refused = _post(server, "/score", cosine)
    assert refused.status_code == 400 and "cosine" in refused.text


def test_cohere_sdk_parses_the_chunk(server: ServerProcess, v2: dict[int, dict]) -> None:
    """ClientV2.rerank sends max_tokens_per_doc and reads the answer; ``chunk`` arrives as
    an extra field of each result."""
    co = cohere.ClientV2(api_key=API_KEY, base_url=server.url)
    ranked = co.rerank(model="reranker", query=QUERY, documents=DOCS, max_tokens_per_doc=SIZE)
    for result in ranked.results:
        assert abs(result.relevance_score - v2[result.index]["relevance_score"]) <= 1e-6
        assert result.chunk == v2[result.index]["chunk"]  # type: ignore[attr-defined]
