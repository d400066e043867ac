"""The bad-input catalog: each case gets its status and an OpenAI-shaped error body,
and the server keeps serving afterwards."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.conftest import API_KEY
from tests.support import ServerProcess

AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG = "word " * 600


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: Any = None
    status: int = 422
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))
    method: str = "POST"
    says: str = ""  # a fragment the message must contain


E = "/v1/embeddings"
CASES = [
    Case("input is a number", E, {"model": "minilm", "input": 5}),
    Case("input missing", E, {"model": "minilm"}, says="input"),
    Case("input null", E, {"model": "minilm", "input": None}),
    Case("input empty list", E, {"model": "minilm", "input": []}),
    Case("input empty string", E, {"model": "minilm", "input": ""}),
    Case("input list with empty string", E, {"model": "minilm", "input": ["ok", ""]}),
    Case("input mixed types", E, {"model": "minilm", "input": ["a", 1]}),
    Case("input nested strings", E, {"model": "minilm", "input": [["a"]]}),
    Case("negative token id", E, {"model": "minilm", "input": [1, -2]}),
    Case(
        "token id past vocab",  # says why (a client's tiktoken ids) and what to change
        E,
        {"model": "minilm", "input": [100264, 9906]},
        400,
        says="vocabulary (0..30521): the client likely tokenised with another vocabulary "
        "(tiktoken's cl100k_base, as LangChain's OpenAIEmbeddings does by default); send the "
        "text instead (LangChain: OpenAIEmbeddings(..., check_embedding_ctx_length=False))",
    ),
    Case(
        "truncate_prompt_tokens zero",
        E,
        {"model": "minilm", "input": "a b", "truncate_prompt_tokens": 0},
        400,
        says="outside 1..256",
    ),
    Case(
        "truncate_prompt_tokens past the max",  # vLLM refuses a k past max_model_len too
        E,
        {"model": "minilm", "input": "a b", "truncate_prompt_tokens": 257},
        400,
        says="outside 1..256",
    ),
    Case(
        "truncate_prompt_tokens below -1",
        E,
        {"model": "minilm", "input": "a b", "truncate_prompt_tokens": -2},
        400,
        says="-1 means it",
    ),
    Case(
        "truncate_prompt_tokens only the special tokens",
        E,
        {"model": "minilm", "input": "a b", "truncate_prompt_tokens": 2},
        400,
        says="no room beside this model's 2 special tokens",
    ),
    Case(
        "truncate_prompt_tokens with truncate false",
        E,
        {"model": "minilm", "input": "a", "truncate_prompt_tokens": 8, "truncate": False},
        400,
        says="send one",
    ),
    Case(
        "truncate_prompt_tokens a string",
        E,
        {"model": "minilm", "input": "a", "truncate_prompt_tokens": "8"},
    ),
    Case(
        "score lengths neither 1:N nor N:N",
        "/score",
        {"model": "reranker", "text_1": ["a", "b"], "text_2": ["c", "d", "e"]},
        400,
        says="1:1, 1:N or N:N",
    ),
    Case("score empty text_2", "/score", {"model": "reranker", "text_1": "a", "text_2": []}),
    Case("score missing text_1", "/v1/score", {"model": "reranker", "text_2": "a"}),
    Case(
        "score truncate_prompt_tokens",
        "/score",
        {"model": "reranker", "text_1": "a", "text_2": "b", "truncate_prompt_tokens": 5},
        400,
        says="-1",
    ),
    Case(
        "score on a classifier",
        "/score",
        {"model": "classifier", "text_1": "a", "text_2": "b"},
        400,
        says="rerank",
    ),
    Case(
        "score too many pairs",
        "/score",
        {"model": "reranker", "text_1": "q", "text_2": ["d"] * 65},
        413,
    ),
    Case(
        "bad encoding_format",
        E,
        {"model": "minilm", "input": "a", "encoding_format": "int4"},
        says="encoding_format",
    ),
    Case(
        "dimensions negative",  # 0 is full size (Infinity's meaning, SPEC-NOTES)
        E,
        {"model": "minilm", "input": "a", "dimensions": -3},
        400,
        says="dimensions",
    ),
    Case(
        "dimensions too big",
        E,
        {"model": "minilm", "input": "a", "dimensions": 385},
        400,
        says="384",
    ),
    Case("dimensions not a number", E, {"model": "minilm", "input": "a", "dimensions": "x"}),
    Case("unknown model", E, {"model": "gpt-9", "input": "a"}, 404, says="minilm"),
    Case("embeddings on a reranker", E, {"model": "reranker", "input": "a"}, 400, says="reranking"),
    Case(
        "rerank on an embedder",
        "/v1/rerank",
        {"model": "minilm", "query": "q", "documents": ["d"]},
        400,
        says="embeddings",
    ),
    Case("classify on a reranker", "/classify", {"model": "reranker", "input": ["a"]}, 400),
    Case("missing API key", E, {"model": "minilm", "input": "a"}, 401, headers={}),
    Case(
        "wrong API key",
        E,
        {"model": "minilm", "input": "a"},
        401,
        headers={"Authorization": "Bearer nope"},
    ),
    Case(
        "not bearer",
        E,
        {"model": "minilm", "input": "a"},
        401,
        headers={"Authorization": f"Basic {API_KEY}"},
    ),
    Case("malformed JSON", E, raw=b'{"input": ["a",', status=400, says="JSON"),
    Case("JSON array body", E, [1, 2, 3]),
    Case(
        "payload over limit",
        E,
        {"model": "minilm", "input": ["x" * 1000] * 250},
        413,
        says="payload-limit",
    ),
    Case(
        "too many inputs",
        E,
        {"model": "minilm", "input": ["a"] * 65},
        413,
        says="max-client-batch-size",
    ),
    Case(
        "too long, truncate off",
        E,
        {"model": "minilm", "input": LONG, "truncate": False},
        400,
        says="602 tokens",
    ),
    Case(
        "TEI embed too long, truncate off",
        "/embed",
        {"model": "minilm", "inputs": LONG, "truncate": False},
        400,
        says="tokens",
    ),
    Case(
        "rerank empty documents", "/v1/rerank", {"model": "reranker", "query": "q", "documents": []}
    ),
    Case("rerank missing query", "/v1/rerank", {"model": "reranker", "documents": ["d"]}),
    Case(
        "rerank top_n zero",
        "/v1/rerank",
        {"model": "reranker", "query": "q", "documents": ["d"], "top_n": 0},
    ),
    Case(
        "rerank document object without text",
        "/v1/rerank",
        {"model": "reranker", "query": "q", "documents": [{"title": "x"}]},
    ),
    Case(
        "rerank too many documents",
        "/v1/rerank",
        {"model": "reranker", "query": "q", "documents": ["d"] * 65},
        413,
    ),
    Case("TEI rerank empty texts", "/rerank", {"query": "q", "texts": []}),
    Case("TEI embed empty list", "/embed", {"inputs": []}),
    Case(
        "TEI embed bad truncation_direction",
        "/embed",
        {"inputs": "a", "truncation_direction": "up"},
    ),
    Case(
        "TEI embed unknown prompt",
        "/embed",
        {"inputs": "a", "prompt_name": "query"},
        400,
        says="prompt_name",
    ),
    Case("predict empty string", "/predict", {"inputs": ""}),
    Case("unknown route", "/v1/nothing", {"input": "a"}, 404),
    Case("GET on a POST route", E, None, 405, method="GET"),
]


def test_catalog_is_large_enough() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(server: ServerProcess, case: Case) -> None:
    headers = {"content-type": "application/json", **case.headers}
    with httpx.Client(base_url=server.url, timeout=60) as http:
        if case.raw is not None:
            response = http.request(case.method, case.path, content=case.raw, headers=headers)
        elif case.method == "GET":
            response = http.get(case.path, headers=headers)
        else:
            response = http.request(case.method, case.path, json=case.body, headers=headers)
        assert response.status_code == case.status, response.text
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str) and error["message"]
        assert error["code"] == case.status
        assert case.says in error["message"]
        # the server is still healthy and serving
        ok = http.post(E, json={"model": "minilm", "input": "still fine"}, headers=AUTH)
        assert ok.status_code == 200, ok.text


def test_chunked_body_over_limit_is_refused(server: ServerProcess) -> None:
    def chunks():
        for _ in range(300):
            yield b"x" * 1000

    with httpx.Client(base_url=server.url, timeout=60) as http:
        response = http.post(
            E, content=chunks(), headers={**AUTH, "content-type": "application/json"}
        )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == 413


def test_flags_take_true_or_false_only(server) -> None:  # type: ignore[no-untyped-def]
    """pydantic's lax bool would read 0 as false: a typo'd flag must not pass silently."""
    with server.client() as client:
        for value in (0, 1, "yes", "false", None):
            body = {"model": "minilm", "input": "x", "truncate": value}
            response = client.post("/v1/embeddings", json=body)
            assert response.status_code == 422, (value, response.text)
        assert (
            client.post(
                "/v1/embeddings", json={"model": "minilm", "input": "x", "truncate": False}
            ).status_code
            == 200
        )


def test_infinity_client_defaults_dimensions_0_and_modality_text(server) -> None:  # type: ignore[no-untyped-def]
    """Infinity's generated client sends `dimensions: 0` (full size) and `modality: text`
    with every request (SPEC-NOTES); a negative size is still refused."""
    with server.client() as client:
        body = {"model": "minilm", "input": ["a cat"], "dimensions": 0, "modality": "text"}
        full = client.post("/v1/embeddings", json=body)
        assert full.status_code == 200 and len(full.json()["data"][0]["embedding"]) == 384
        tei = client.post("/embed", json={"model": "minilm", "inputs": "a cat", "dimensions": 0})
        assert tei.status_code == 200 and len(tei.json()[0]) == 384
        bad = client.post("/v1/embeddings", json={**body, "dimensions": -1})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "dimensions"
        image = client.post("/v1/embeddings", json={**body, "modality": "image"})
        message = image.json()["error"]["message"]
        assert image.status_code == 400 and "does not take image input" in message
        assert client.get("/health").status_code == 200
