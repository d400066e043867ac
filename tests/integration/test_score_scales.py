"""Each rerank dialect's scale, for a reranker shaped like cross-encoder/ms-marco-MiniLM-L6-v2:
its config.json names an Identity ``activation_fn``, so ``CrossEncoder.predict`` gives raw
logits. Cohere (``/v1/rerank``, ``/v2/rerank``), Infinity (``/rerank``, ``ember.infinity``)
and TEI (``/rerank``, ``POST /``) answer sigmoid(logit), as those projects do and their
clients threshold on; vLLM's ``/score`` answers what the files say (the logit), as vLLM and
``CrossEncoder.predict`` do. ``raw_scores`` (``use_activation: false``) is the logit
everywhere. One real ``ember serve``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support import ServerProcess, start_server

QUERY = "what is a dense retriever?"
DOCS = [
    "A dense retriever embeds queries and documents into one vector space.",
    "The stock market fell sharply on Tuesday.",
    "BM25 is a sparse lexical ranking function.",
    "Cats like to sit on warm mats.",
    "Rerankers score each query and document pair together.",
]


def build_ms_marco_shaped_reranker(root: Path) -> Path:
    """A tiny one-label BERT classifier saved by transformers' ``save_pretrained`` with
    ms-marco-MiniLM-L6-v2's ``config.json`` key ``sentence_transformers.activation_fn``:
    Identity (no ``config_sentence_transformers.json``, no ``modules.json``)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests.fixtures.tiny_models import build_tiny_reranker

    base = build_tiny_reranker(root / "base", seed=7)
    model = AutoModelForSequenceClassification.from_pretrained(str(base))
    model.config.sentence_transformers = {
        "activation_fn": "torch.nn.modules.linear.Identity",
        "version": "4.0.1",
    }
    target = root / "ms-marco-shaped"
    with torch.no_grad():  # a bias so the logits straddle 0 and leave [0, 1]
        model.classifier.bias.fill_(3.0)
    model.save_pretrained(str(target))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(target))
    return target


@pytest.fixture(scope="module")
def reranker_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_ms_marco_shaped_reranker(tmp_path_factory.mktemp("score-scales"))


@pytest.fixture(scope="module")
def logits(reranker_path: Path) -> np.ndarray:
    """CrossEncoder.predict's scores: the files say Identity, so the raw logits."""
    import torch
    from sentence_transformers import CrossEncoder

    reference = CrossEncoder(str(reranker_path), device="cpu")
    assert isinstance(reference.activation_fn, torch.nn.Identity)
    scores = np.asarray(reference.predict([(QUERY, d) for d in DOCS]), dtype=np.float64)
    assert (scores > 1).any() or (scores < 0).any(), scores  # not a probability
    return scores


@pytest.fixture(scope="module")
def server(reranker_path: Path) -> Iterator[ServerProcess]:
    # The exact path: scores within 1e-4 of CrossEncoder's on any CPU kind.
    args = ["--model-id", str(reranker_path), "--served-model-name", "msmarco"]
    args += ["--dtype", "float32"]
    with start_server(args) as proc:
        yield proc


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    answer = httpx.post(server.url + path, json=body, timeout=60)
    assert answer.status_code == 200, (path, answer.text)
    return answer.json()


def _by_index(results: list[dict], key: str) -> np.ndarray:
    scores = np.empty(len(DOCS))
    for item in results:
        scores[item["index"]] = item[key]
    return scores


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank"])
def test_cohere_and_infinity_bodies_answer_a_probability(
    server: ServerProcess, logits: np.ndarray, path: str, raw: bool
) -> None:
    body = {"model": "msmarco", "query": QUERY, "documents": DOCS, "raw_scores": raw}
    got = _by_index(_post(server, path, body)["results"], "relevance_score")
    np.testing.assert_allclose(got, logits if raw else _sigmoid(logits), atol=1e-4)
    if not raw:
        assert ((got >= 0) & (got <= 1)).all(), got


@pytest.mark.parametrize("raw", [False, True])
@pytest.mark.parametrize("path", ["/rerank", "/"])
def test_tei_bodies_answer_a_probability(
    server: ServerProcess, logits: np.ndarray, path: str, raw: bool
) -> None:
    body = {"model": "msmarco", "query": QUERY, "texts": DOCS, "raw_scores": raw}
    got = _by_index(_post(server, path, body), "score")
    np.testing.assert_allclose(got, logits if raw else _sigmoid(logits), atol=1e-4)


@pytest.mark.parametrize("use_activation", [None, True, False])
def test_vllm_score_follows_the_files(
    server: ServerProcess, logits: np.ndarray, use_activation: bool | None
) -> None:
    """vLLM applies the files' activation on /score: Identity, so the logit either way."""
    body: dict[str, Any] = {"model": "msmarco", "text_1": QUERY, "text_2": DOCS}
    if use_activation is not None:
        body["use_activation"] = use_activation
    got = [d["score"] for d in _post(server, "/score", body)["data"]]
    np.testing.assert_allclose(got, logits, atol=1e-4)


def test_embedded_infinity_api_answers_a_probability(
    reranker_path: Path, logits: np.ndarray
) -> None:
    """``ember.infinity`` mirrors Infinity's ``rerank``: sigmoid unless raw_scores."""
    from ember.infinity import AsyncEngineArray, EngineArgs

    async def scores(raw: bool) -> np.ndarray:
        args = EngineArgs(model_name_or_path=str(reranker_path), engine="torch")
        array = AsyncEngineArray.from_args([args])
        await array.astart()
        try:
            ranked, _ = await array[0].rerank(query=QUERY, docs=DOCS, raw_scores=raw)
        finally:
            await array.astop()
        got = np.empty(len(DOCS))
        for item in ranked:
            got[item.index] = item.relevance_score
        return got

    np.testing.assert_allclose(asyncio.run(scores(False)), _sigmoid(logits), atol=1e-4)
    np.testing.assert_allclose(asyncio.run(scores(True)), logits, atol=1e-4)
