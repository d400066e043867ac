"""vLLM's and mteb's conventions, against their documented bodies: ``max_model_len`` on the
model cards, ``truncate_prompt_tokens`` on /v1/embeddings (the last k tokens, special tokens
counted), ``/score`` and ``/v1/score`` (vLLM's ``ScoreRequest``/``ScoreResponse``), and the
flag that refuses token-id input (Infinity's behaviour: its 400 is checked in a real
`ember embed --no-accept-token-ids` run, tests/integration/test_batch_job.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.config import settings_from_env
from tests.support import ServerProcess

# Distinct ends, so that keeping the first and keeping the last tokens differ.
LONG = "alpha beta gamma " * 120 + "the very end of a long text about rivers"


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    with server.client() as client:
        answer = client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _post_get(server: ServerProcess, path: str) -> Any:
    with server.client() as client:
        answer = client.get(path)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _ids(model: Path, text: str) -> list[int]:
    """The text's ids without special tokens, untruncated (/tokenize cuts at the max)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.no_truncation()
    return tokenizer.encode(text, add_special_tokens=False).ids


def _vector(server: ServerProcess, **body: Any) -> tuple[np.ndarray, int]:
    answer = _post(server, "/v1/embeddings", {"model": "minilm", **body})
    return np.asarray(answer["data"][0]["embedding"]), answer["usage"]["prompt_tokens"]


def test_model_cards_carry_max_model_len(server: ServerProcess) -> None:
    cards = {c["id"]: c for c in _post_get(server, "/v1/models")["data"]}
    assert cards["minilm"]["max_model_len"] == cards["minilm"]["max_input_length"] == 256
    assert cards["reranker"]["max_model_len"] == cards["reranker"]["max_input_length"]


def test_truncate_prompt_tokens_keeps_the_last_k_tokens(
    server: ServerProcess, minilm_path: Path
) -> None:
    ids = _ids(minilm_path, LONG)
    assert len(ids) > 256
    # k counts [CLS] and [SEP]: k=6 is them around the last 4 tokens of the text.
    cut, tokens = _vector(server, input=LONG, truncate_prompt_tokens=6)
    same, _ = _vector(server, input=ids[-4:])  # token-id input gets [CLS] ... [SEP] too
    assert tokens == 6
    assert np.abs(cut - same).max() < 1e-5
    # -1 is the model's max length, kept from the end (the default keeps the start).
    longest, tokens = _vector(server, input=LONG, truncate_prompt_tokens=-1)
    tail, _ = _vector(server, input=ids[-254:])
    head, _ = _vector(server, input=LONG)
    assert tokens == 256
    assert np.abs(longest - tail).max() < 1e-5
    assert float(longest @ head) < 0.99
    # Token-id input is cut the same way; a short input is left whole.
    ids_cut, tokens = _vector(server, input=ids, truncate_prompt_tokens=6)
    assert tokens == 6 and np.abs(ids_cut - same).max() < 1e-5
    short, tokens = _vector(server, input="a short text", truncate_prompt_tokens=100)
    whole, whole_tokens = _vector(server, input="a short text")
    assert tokens == whole_tokens and np.abs(short - whole).max() < 1e-6


def _rerank(server: ServerProcess, query: str, documents: list[str], **extra: Any) -> list:
    answer = _post(
        server, "/v1/rerank", {"model": "reranker", "query": query, "documents": documents, **extra}
    )
    return [r["relevance_score"] for r in sorted(answer["results"], key=lambda r: r["index"])]


def _check_score_body(answer: dict[str, Any], model: str, pairs: int) -> list[float]:
    """vLLM's ScoreResponse, field by field."""
    assert set(answer) == {"id", "object", "created", "model", "data", "usage"}
    assert answer["object"] == "list" and answer["model"] == model
    assert isinstance(answer["id"], str) and isinstance(answer["created"], int)
    assert set(answer["usage"]) == {"prompt_tokens", "total_tokens"}
    assert answer["usage"]["prompt_tokens"] > 0
    assert [d["index"] for d in answer["data"]] == list(range(pairs))
    assert all(
        set(d) == {"index", "object", "score"} and d["object"] == "score" for d in answer["data"]
    )
    return [d["score"] for d in answer["data"]]


def test_score_is_vllms_body_with_the_rerank_scores(server: ServerProcess) -> None:
    docs = ["Paris is the capital of France.", "Bananas are yellow.", "France borders Spain."]
    query = "What is the capital of France?"
    one_to_n = _post(server, "/score", {"model": "reranker", "text_1": query, "text_2": docs})
    scores = _check_score_body(one_to_n, "reranker", 3)
    assert np.allclose(scores, _rerank(server, query, docs), atol=1e-6)
    # /v1/score is the same route; vLLM's later names for the sides are taken too.
    again = _post(server, "/v1/score", {"model": "reranker", "queries": [query], "documents": docs})
    assert np.allclose(_check_score_body(again, "reranker", 3), scores, atol=1e-6)
    # N:N pairs by position; 1:1 with strings.
    pairs = _post(
        server, "/score", {"model": "reranker", "text_1": [query, "fruit"], "text_2": docs[:2]}
    )
    want = [_rerank(server, query, docs[:1])[0], _rerank(server, "fruit", docs[1:2])[0]]
    assert np.allclose(_check_score_body(pairs, "reranker", 2), want, atol=1e-6)
    single = _post(server, "/score", {"model": "reranker", "text_1": query, "text_2": docs[0]})
    assert np.allclose(_check_score_body(single, "reranker", 1), scores[:1], atol=1e-6)
    # use_activation false: the raw logits (Ember's raw_scores).
    raw = _post(
        server,
        "/score",
        {"model": "reranker", "text_1": query, "text_2": docs, "use_activation": False},
    )
    want = _rerank(server, query, docs, raw_scores=True)
    assert np.allclose(_check_score_body(raw, "reranker", 3), want, atol=1e-5)


def test_score_on_an_embedding_model_is_the_cosine(server: ServerProcess) -> None:
    texts = ["a cat sat on the mat", "a kitten on a rug", "quarterly revenue grew"]
    answer = _post(server, "/score", {"model": "minilm", "text_1": texts[0], "text_2": texts})
    vectors = np.asarray(
        [
            d["embedding"]
            for d in _post(server, "/v1/embeddings", {"model": "minilm", "input": texts})["data"]
        ]
    )
    assert np.allclose(_check_score_body(answer, "minilm", 3), vectors @ vectors[0], atol=1e-5)


def test_the_token_id_flag_resolves_from_cli_env_and_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ember.cli import build_parser

    assert settings_from_env().model_specs()[0].accept_token_ids is True
    monkeypatch.setenv("EMBER_ACCEPT_TOKEN_IDS", "false")
    assert settings_from_env().model_specs()[0].accept_token_ids is False
    for flag, value in (("--accept-token-ids", True), ("--no-accept-token-ids", False)):
        args = vars(build_parser().parse_args(["serve", flag]))
        assert (
            settings_from_env(accept_token_ids=args["accept_token_ids"]).accept_token_ids is value
        )
