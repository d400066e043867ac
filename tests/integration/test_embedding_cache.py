"""The embedding cache through a real `ember serve --cache-entries` (fixture
``cache_server``): a hit answers the same bytes as the miss that stored it, for dense,
sparse (SPLADE) and multi-vector (ColBERT) outputs, float and base64, on the OpenAI and TEI
routes; no hit across models, dimensions or query/document sides; the metrics move.

The OpenAI answer's ``id`` (a new uuid per answer) and ``created`` (the clock) differ between
any two answers, cached or not: they are blanked before comparing; every other byte,
``usage`` included, must be equal. Each test sends texts of its own, so no test's entries
serve another's. Identical misses at once compute once: counted as one miss, the rest
merged (or, for a request that comes after the first finished, hits)."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from tests.support import ServerProcess

_PER_ANSWER = re.compile(rb'"(id)":"[0-9a-f-]{36}"|"(created)":\d+')


def _blank(content: bytes) -> bytes:
    return _PER_ANSWER.sub(lambda m: b'"%s":_' % (m.group(1) or m.group(2)), content)


def cache_counts(
    client: httpx.Client, model: str, kinds: tuple[str, ...] = ("hits", "misses")
) -> tuple[float, ...]:
    """(hits, misses), or the ``kinds`` named, the server's /metrics counts for ``model``."""
    text = client.get("/metrics").text
    found = []
    for kind in kinds:
        match = re.search(rf'^ember_cache_{kind}_total{{model="{model}"}} (\S+)$', text, re.M)
        found.append(float(match.group(1)) if match else 0.0)
    return tuple(found)


def twice(client: httpx.Client, path: str, body: dict) -> tuple[bytes, bytes]:
    """The same request sent twice: (the miss's answer, the hit's), both 200."""
    first = client.post(path, json=body)
    second = client.post(path, json=body)
    assert first.status_code == second.status_code == 200, first.text
    return first.content, second.content


CASES = [
    # (model, path, body without model, cached inputs per request)
    ("minilm", "/v1/embeddings", {"input": ["dense one", "dense two"]}, 2),
    ("minilm", "/v1/embeddings", {"input": ["dense b64"], "encoding_format": "base64"}, 1),
    ("minilm", "/embed", {"inputs": ["dense tei", "dense tei 2"], "normalize": False}, 2),
    ("splade", "/v1/embeddings", {"input": ["sparse one", "sparse two"]}, 2),
    ("splade", "/embed_sparse", {"inputs": ["sparse tei"]}, 1),
    ("colbert", "/v1/embeddings", {"input": ["multi one", "multi two"]}, 2),
    ("colbert", "/v1/embeddings", {"input": ["multi b64"], "encoding_format": "base64"}, 1),
    ("colbert", "/embed_all", {"inputs": ["multi tei"], "prompt_name": "query"}, 1),
]


@pytest.mark.parametrize(("model", "path", "body", "count"), CASES)
def test_a_hit_answers_the_bytes_of_the_miss(
    cache_server: ServerProcess, model: str, path: str, body: dict, count: int
) -> None:
    with cache_server.client() as client:
        hits, misses = cache_counts(client, model)
        miss, hit = twice(client, path, {"model": model, **body})
        assert cache_counts(client, model) == (hits + count, misses + count)
    assert _blank(hit) == _blank(miss)
    assert b'"usage"' in miss or path != "/v1/embeddings"


def test_a_partly_cached_request_merges_in_order(cache_server: ServerProcess) -> None:
    with cache_server.client() as client:
        client.post("/v1/embeddings", json={"model": "minilm", "input": "partly b"})
        hits, misses = cache_counts(client, "minilm")
        body = {"model": "minilm", "input": ["partly a", "partly b", "partly c"]}
        mixed, cached = twice(client, "/v1/embeddings", body)  # 1 hit + 2 misses, then 3 hits
        assert cache_counts(client, "minilm") == (hits + 4, misses + 2)
        alone = client.post("/v1/embeddings", json={"model": "minilm", "input": "partly c"})
    assert _blank(cached) == _blank(mixed)
    rows = httpx.Response(200, content=mixed).json()["data"]
    assert [d["index"] for d in rows] == [0, 1, 2]
    assert rows[2]["embedding"] == alone.json()["data"][0]["embedding"]


def test_no_hit_across_models_dimensions_or_sides(cache_server: ServerProcess) -> None:
    text = "the same text each time"
    with cache_server.client() as client:
        full = client.post("/v1/embeddings", json={"model": "minilm", "input": text}).json()
        # The same files under another name: a model of its own.
        b_hits, b_misses = cache_counts(client, "minilm-b")
        other = client.post("/v1/embeddings", json={"model": "minilm-b", "input": text})
        assert other.status_code == 200
        assert cache_counts(client, "minilm-b") == (b_hits, b_misses + 1)

        hits, misses = cache_counts(client, "minilm")
        short = client.post(
            "/v1/embeddings", json={"model": "minilm", "input": text, "dimensions": 64}
        ).json()
        assert cache_counts(client, "minilm") == (hits, misses + 1)
        assert len(short["data"][0]["embedding"]) == 64 < len(full["data"][0]["embedding"])

        hits, misses = cache_counts(client, "colbert")
        sides = [
            client.post(
                "/v1/embeddings", json={"model": "colbert", "input": text, "input_type": side}
            ).json()["data"][0]["embedding"]
            for side in ("search_document", "search_query")
        ]
        assert cache_counts(client, "colbert") == (hits, misses + 2)
    assert sides[0] != sides[1]  # a query is expanded and marked: not the document's vectors


MERGED = ("hits", "misses", "merged")


def test_the_same_input_eight_times_in_one_request_is_computed_once(
    cache_server: ServerProcess,
) -> None:
    with cache_server.client() as client:
        before = cache_counts(client, "minilm", MERGED)
        answer = client.post("/v1/embeddings", json={"model": "minilm", "input": ["eight"] * 8})
        assert answer.status_code == 200, answer.text
        assert cache_counts(client, "minilm", MERGED) == (before[0], before[1] + 1, before[2] + 7)
        one = client.post("/v1/embeddings", json={"model": "minilm", "input": "eight"}).json()
    rows = answer.json()["data"]
    assert [r["index"] for r in rows] == list(range(8))
    assert all(r["embedding"] == one["data"][0]["embedding"] for r in rows)
    assert answer.json()["usage"]["prompt_tokens"] == 8 * one["usage"]["prompt_tokens"]


def test_eight_identical_requests_at_once_compute_once(cache_server: ServerProcess) -> None:
    body = {"model": "minilm", "input": ["eight requests at once, the same text each"]}

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=cache_server.url, headers=cache_server.headers, timeout=60
        ) as client:
            return await asyncio.gather(
                *(client.post("/v1/embeddings", json=body) for _ in range(8))
            )

    with cache_server.client() as client:
        hits, misses, merged = cache_counts(client, "minilm", MERGED)
        answers = asyncio.run(together())
        assert [a.status_code for a in answers] == [200] * 8
        now = cache_counts(client, "minilm", MERGED)
    # one computed; each other one waited on it or (arriving after it finished) hit it
    assert now[1] == misses + 1 and (now[0] - hits) + (now[2] - merged) == 7
    assert len({_blank(a.content) for a in answers}) == 1
