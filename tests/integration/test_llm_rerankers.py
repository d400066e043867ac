"""LLM rerankers through a real ``ember serve`` on every backend the kind claims (torch, which
``--backend auto`` picks, and onnx): tiny seeded Qwen3-Reranker, mxbai-rerank-v2 and
bge-reranker-v2-gemma layouts against each family's documented algorithm, computed here on
transformers' full-vocabulary logits of ``AutoModelForCausalLM`` (the card's, the
mxbai-rerank package's and FlagEmbedding's steps, transcribed in
``tests/fixtures/llm_rerankers.py``: neither package installs beside Ember's pins).
|Δscore| <= 1e-4 for the relevance score and the raw logit difference, on /v1/rerank,
/v2/rerank and /rerank (Cohere's and TEI's bodies), with the card's instruction, a
request's and a model's own (``--instruction``); embed and classify routes refuse them
with a 400.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio

from ember.api.app import create_app
from ember.config import settings_from_env
from ember.engine import EngineArray
from tests.fixtures.llm_rerankers import (
    build_tiny_gemma_reranker,
    build_tiny_mxbai_reranker,
    build_tiny_qwen3_reranker,
    reference_scores,
    scores_by_index,
)
from tests.support import ServerProcess, refused_start, start_server

TOLERANCE = 1e-4
QUERY = "what is the capital of the country?"
# Lengths from 3 to ~60 words: one batch pads most rows, so each row's last position counts.
DOCUMENTS = [
    "the capital is a city.",
    "it was the first time that he had been there, and the people of the house were not "
    "at home; they had gone to the city for the day and would be back at night.",
    "no.",
    " ".join(["the state of the world and the people who live in it"] * 5),
    "yes, the capital of the country is the city where the government is.",
]
CODE_INSTRUCTION = "Given a code question, retrieve the snippet that answers it"
FAMILIES = ("qwen3", "mxbai", "gemma")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llm-rerankers")
    return {
        "qwen3": build_tiny_qwen3_reranker(root),
        "mxbai": build_tiny_mxbai_reranker(root),
        "gemma": build_tiny_gemma_reranker(root),
    }


@pytest.fixture(scope="module", params=["auto", "onnx"])
def server(
    request: pytest.FixtureRequest,
    models: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """The three families, and Qwen3 again served with its own ``--instruction``."""
    args = ["--backend", request.param, "--cache-dir", str(tmp_path_factory.mktemp("cache"))]
    for name, path in [*models.items(), ("qwen3-code", models["qwen3"])]:
        args += ["--model-id", str(path), "--served-model-name", name]
        args += ["--instruction", CODE_INSTRUCTION if name == "qwen3-code" else "auto"]
    with start_server(args) as running:
        yield running


def _close(got: np.ndarray, want: np.ndarray) -> float:
    worst = float(np.abs(got - want).max())
    assert worst <= TOLERANCE, (got, want)
    return worst


def test_auto_serves_them_on_torch(server: ServerProcess, request: pytest.FixtureRequest) -> None:
    with server.client() as client:
        info = client.get("/info").json()
        models = client.get("/v1/models").json()["data"]
    asked = request.node.callspec.params["server"]
    assert info["backend"] == {"auto": "torch", "onnx": "onnx"}[asked]
    assert {m["id"]: m["capabilities"] for m in models} == {
        name: ["rerank"] for name in ("qwen3", "mxbai", "gemma", "qwen3-code")
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_cohere_rerank_matches_the_reference(
    server: ServerProcess, models: dict[str, Path], family: str
) -> None:
    scores, raw = reference_scores(models[family], family, QUERY, DOCUMENTS)
    body = {"model": family, "query": QUERY, "documents": DOCUMENTS, "return_documents": True}
    with server.client() as client:
        got = client.post("/v1/rerank", json=body).json()
        got_raw = client.post("/v2/rerank", json={**body, "raw_scores": True}).json()
    results = got["results"]
    assert [r["relevance_score"] for r in results] == sorted(
        (r["relevance_score"] for r in results), reverse=True
    )
    assert all(r["document"]["text"] == DOCUMENTS[r["index"]] for r in results)
    _close(scores_by_index(results, "relevance_score"), scores)
    _close(scores_by_index(got_raw["results"], "relevance_score"), raw)
    assert np.ptp(raw) > 0.3  # the documents are told apart: a wrong row would show


@pytest.mark.parametrize("family", FAMILIES)
def test_rerank_route_takes_both_bodies(
    server: ServerProcess, models: dict[str, Path], family: str
) -> None:
    scores, raw = reference_scores(models[family], family, QUERY, DOCUMENTS)
    with server.client() as client:
        cohere = client.post(
            "/rerank", json={"model": family, "query": QUERY, "documents": DOCUMENTS}
        ).json()
        tei = client.post(
            "/rerank",
            json={"model": family, "query": QUERY, "texts": DOCUMENTS, "raw_scores": True},
        ).json()
    _close(scores_by_index(cohere["results"], "relevance_score"), scores)
    _close(scores_by_index(tei, "score"), raw)


@pytest.mark.parametrize(
    ("family", "instruction"),
    [
        ("qwen3", "Given a question, retrieve the passage that names a city"),
        ("mxbai", "Find the passage that names a city"),
        ("gemma", "Given a query A and a passage B, say 'Yes' if B names a city, else 'No'."),
    ],
)
def test_a_request_instruction_replaces_the_model_one(
    server: ServerProcess, models: dict[str, Path], family: str, instruction: str
) -> None:
    default, _ = reference_scores(models[family], family, QUERY, DOCUMENTS)
    scores, _ = reference_scores(models[family], family, QUERY, DOCUMENTS, instruction)
    assert float(np.abs(scores - default).max()) > 1e-3  # the instruction changes the scores
    body = {"model": family, "query": QUERY, "texts": DOCUMENTS, "instruction": instruction}
    with server.client() as client:
        tei = client.post("/rerank", json=body).json()
    _close(scores_by_index(tei, "score"), scores)


def test_a_model_instruction_is_its_default(server: ServerProcess, models: dict[str, Path]) -> None:
    scores, _ = reference_scores(models["qwen3"], "qwen3", QUERY, DOCUMENTS, CODE_INSTRUCTION)
    other = "Given a web search query, retrieve relevant passages that answer the query"
    overridden, _ = reference_scores(models["qwen3"], "qwen3", QUERY, DOCUMENTS, other)
    body = {"model": "qwen3-code", "query": QUERY, "documents": DOCUMENTS}
    with server.client() as client:
        own = client.post("/v1/rerank", json=body).json()["results"]
        asked = client.post("/v1/rerank", json={**body, "instruction": other}).json()["results"]
    _close(scores_by_index(own, "relevance_score"), scores)
    _close(scores_by_index(asked, "relevance_score"), overridden)


@pytest.mark.parametrize(("family", "size"), [("gemma", None), ("qwen3", 48)])
def test_a_long_document_scores_its_best_chunk(
    server: ServerProcess, models: dict[str, Path], family: str, size: int | None
) -> None:
    """max_chunks_per_doc alone cuts chunks of what the prompt keeps beside the query
    (bge-reranker-v2-gemma's budget, less than its length less the query: none is cut);
    the document's score is its best chunk's, the family's own score of that text."""
    long = " ".join([DOCUMENTS[1], DOCUMENTS[4], DOCUMENTS[3]] * 6)
    body = {"model": family, "query": QUERY, "documents": [long, DOCUMENTS[2]]}
    body |= {"max_chunks_per_doc": 40, "max_tokens_per_doc": size}
    with server.client() as client:
        answer = client.post("/v2/rerank", json=body)
    assert answer.status_code == 200 and answer.headers["x-ember-truncated"] == "0", answer.text
    best = next(r for r in answer.json()["results"] if r["index"] == 0)
    chunk = best["chunk"]
    assert chunk["char_end"] < len(long) or chunk["index"] > 0  # a chunk, not the document
    text = long[chunk["char_start"] : chunk["char_end"]]
    scores, _ = reference_scores(models[family], family, QUERY, [text])
    _close(np.array([best["relevance_score"]]), scores)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": "qwen3", "input": ["a query"]}),
        ("/embed", {"model": "mxbai", "inputs": ["a query"]}),
        ("/classify", {"model": "gemma", "input": ["a query"]}),
    ],
)
def test_embed_and_classify_routes_refuse_them(
    server: ServerProcess, path: str, body: dict
) -> None:
    with server.client() as client:
        answer = client.post(path, json=body)
    assert answer.status_code == 400, answer.text
    assert "(llm-reranker)" in answer.text and "reranking (llm)" in answer.text, answer.text


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def app(models: dict[str, Path], tiny_reranker_path: Path) -> AsyncIterator[Any]:
    """In process: a BERT cross-encoder beside the Qwen3 layout."""
    settings = settings_from_env(
        model_id=f"{tiny_reranker_path};{models['qwen3']}",
        served_model_name="cross-encoder;qwen3",
        backend="torch",
    )
    array = EngineArray(settings.model_specs())
    await array.start()
    yield create_app(settings, array)
    await array.stop()


@pytest.mark.asyncio(loop_scope="session")
async def test_an_instruction_or_a_cut_it_cannot_make_is_a_400(app: Any) -> None:
    long = " ".join(["the people of the state and the world"] * 1250)  # ~10,000 tokens
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        cross = await client.post(
            "/v1/rerank",
            json={"model": "cross-encoder", "query": "q", "documents": ["d"], "instruction": "x"},
        )
        uncut = await client.post(
            "/rerank", json={"model": "qwen3", "query": "q", "texts": [long], "truncate": False}
        )
        cut = await client.post("/rerank", json={"model": "qwen3", "query": "q", "texts": [long]})
        empty = await client.post(
            "/v1/rerank",
            json={"model": "qwen3", "query": "q", "documents": ["d"], "instruction": ""},
        )
    assert cross.status_code == 400, cross.text
    assert cross.json()["error"]["message"] == (
        "model 'cross-encoder' (cross-encoder) takes no instruction; `instruction` is for LLM "
        "rerankers"
    )
    assert uncut.status_code == 400 and "send truncate=true" in uncut.text, uncut.text
    assert cut.status_code == 200 and len(cut.json()) == 1
    assert empty.status_code == 422


def test_serve_refuses_an_unnamed_causal_lm_in_one_line(
    models: dict[str, Path], tmp_path: Path
) -> None:
    path = tmp_path / "my-model"
    shutil.copytree(models["mxbai"], path)
    errors = refused_start(["--model-id", str(path)])
    assert errors == [
        f"ember: error: {path} is a Qwen2ForCausalLM without a sentence-transformers pooling "
        "config: an LLM reranker or a decoder its files do not say; pass --task rerank to serve "
        "it as mxbai-rerank-v2 (mixedbread-ai/mxbai-rerank-base-v2's template), or --pooling "
        "last to embed with it"
    ]
