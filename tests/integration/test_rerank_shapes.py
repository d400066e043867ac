"""Each rerank route answers in its own project's shape, and every body honours top_n.

Infinity's ``/rerank`` carries the document as a string (null without
``return_documents``); Cohere's ``/v1/rerank`` and ``/v2/rerank`` carry ``{"text": ...}``;
TEI's body (``texts``) on ``/rerank`` and ``POST /`` answers TEI's list. One session
server, a handful of small requests.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support import ServerProcess

QUERY = "Where do cats sit?"
DOCS = [
    "Cats like to sit on mats.",
    "The stock market fell.",
    "A mat is on the floor.",
    "Dogs chase cats.",
    "Rain is wet.",
]


def _post(server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    answer = httpx.post(server.url + path, json=body, headers=server.headers, timeout=60)
    assert answer.status_code == 200, (path, answer.text)
    return answer.json()


def _cohere_body(**more: Any) -> dict[str, Any]:
    return {"model": "reranker", "query": QUERY, "documents": DOCS, **more}


def test_infinity_route_answers_the_document_string(server: ServerProcess) -> None:
    full = _post(server, "/rerank", _cohere_body(return_documents=True))["results"]
    assert sorted(r["index"] for r in full) == list(range(len(DOCS)))
    assert [r["document"] for r in full] == [DOCS[r["index"]] for r in full]
    bare = _post(server, "/rerank", _cohere_body())["results"]
    assert [r["document"] for r in bare] == [None] * len(DOCS)  # present, null
    assert [(r["index"], r["relevance_score"]) for r in bare] == [
        (r["index"], r["relevance_score"]) for r in full
    ]


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_cohere_routes_answer_text_objects(server: ServerProcess, path: str) -> None:
    infinity = _post(server, "/rerank", _cohere_body())["results"]
    full = _post(server, path, _cohere_body(return_documents=True))["results"]
    assert [r["document"] for r in full] == [{"text": DOCS[r["index"]]} for r in full]
    assert [(r["index"], r["relevance_score"]) for r in full] == [
        (r["index"], r["relevance_score"]) for r in infinity
    ]
    bare = _post(server, path, _cohere_body())["results"]
    assert all("document" not in r for r in bare)


def test_top_n_on_every_rerank_body(server: ServerProcess) -> None:
    """The two best, in order, whichever body asks (LiteLLM's huggingface/ provider sends
    TEI's body with top_n)."""
    ranking = [r["index"] for r in _post(server, "/rerank", _cohere_body())["results"]]
    best = ranking[:2]
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        results = _post(server, path, _cohere_body(top_n=2))["results"]
        assert [r["index"] for r in results] == best, path
    tei = {"model": "reranker", "query": QUERY, "texts": DOCS, "top_n": 2, "return_text": True}
    for path in ("/rerank", "/"):
        ranked = _post(server, path, tei)
        assert [r["index"] for r in ranked] == best, path
        assert [r["text"] for r in ranked] == [DOCS[i] for i in best]
    assert len(_post(server, "/rerank", {**tei, "top_n": 99})) == len(DOCS)
    for bad in (0, -1, "2", 1.5, True):
        refused = httpx.post(
            server.url + "/rerank", json={**tei, "top_n": bad}, headers=server.headers
        )
        assert refused.status_code in (400, 422), (bad, refused.text)
        assert "top_n" in refused.text
