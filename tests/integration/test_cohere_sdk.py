"""Cohere's embed API driven by the real ``cohere`` SDK, v1 ``Client`` and v2 ``ClientV2``.

The SDK takes the server root as ``base_url`` and appends ``/v1/embed`` or ``/v2/embed``
itself (unlike OpenAI's, whose base URL ends in ``/v1``). The first tests run the SDK
against an in-process transport (what it sends, what it parses); the rest against a
real ``ember serve``, checked against sentence-transformers and the documented formulas.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import cohere
import httpx
import numpy as np
import pytest
from cohere.core.api_error import ApiError

from ember.api.dialects import dumps
from ember.api.dialects.cohere import (
    TRUNCATION,
    CohereEmbedRequest,
    CohereEmbedV2Request,
    embed_response,
)
from ember.heads.quantize import EMBEDDING_TYPES, encode_embeddings
from ember.prompts import PROMPT_NAMES, prompt_for
from tests.conftest import API_KEY
from tests.support import ServerProcess

TEXTS = ["The cat sat on the mat.", "Embeddings map text to vectors.", "🙂 unicode ü"]
# START and END keep different halves of this (MiniLM keeps 256 tokens).
LONG = "cats purr softly " * 150 + "dogs bark loudly " * 150


def _field(kind: str) -> str:
    return "float_" if kind == "float" else kind  # the SDK's attribute for "float"


def _rows(response: Any, kind: str) -> list:
    return getattr(response.embeddings, _field(kind))


# ---- the SDK against an in-process transport --------------------------------------------


class Recorder:
    """An httpx transport that records what the SDK sends and answers with our builder."""

    def __init__(self, dims: int = 12) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.dims = dims
        self.rng = np.random.default_rng(0)
        self.vectors = np.zeros((0, dims), dtype=np.float32)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.sent.append((request.url.path, body))
        model = CohereEmbedV2Request if request.url.path == "/v2/embed" else CohereEmbedRequest
        parsed = model.model_validate(body)
        assert parsed.texts is not None
        vectors = self.rng.standard_normal((len(parsed.texts), self.dims)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        v2 = model is CohereEmbedV2Request
        answer = embed_response(
            vectors,
            parsed.texts,
            7,
            embedding_types=parsed.embedding_types or (["float"] if v2 else None),
            api_version="2" if v2 else "1",
        )
        self.vectors = vectors
        return httpx.Response(
            200,
            content=dumps(answer),
            headers={"content-type": "application/json"},
        )


@pytest.fixture
def recorded() -> Iterator[tuple[Recorder, Callable[[type], Any]]]:
    recorder = Recorder()
    http = httpx.Client(transport=httpx.MockTransport(recorder))

    def client(kind: type) -> Any:
        return kind(api_key="k", base_url="http://ember.test", httpx_client=http, max_retries=0)

    yield recorder, client
    http.close()


def test_sdk_paths_and_bodies(recorded) -> None:
    recorder, client = recorded
    client(cohere.Client).embed(texts=TEXTS, model="m")
    client(cohere.ClientV2).embed(
        texts=TEXTS,
        model="m",
        input_type="search_query",
        embedding_types=["int8", "float"],
        truncate="START",
        output_dimension=8,
        max_tokens=512,
        priority=1,
    )
    (path1, body1), (path2, body2) = recorder.sent
    assert path1 == "/v1/embed" and body1 == {"texts": TEXTS, "model": "m"}
    assert path2 == "/v2/embed"
    assert body2 == {
        "texts": TEXTS,
        "model": "m",
        "input_type": "search_query",
        "embedding_types": ["int8", "float"],
        "truncate": "START",
        "output_dimension": 8,
        "max_tokens": 512,
        "priority": 1,
    }


def test_sdk_v1_parses_the_floats_shape(recorded) -> None:
    recorder, client = recorded
    response = client(cohere.Client).embed(texts=TEXTS, model="m", input_type="search_document")
    assert response.response_type == "embeddings_floats"
    np.testing.assert_allclose(np.array(response.embeddings), recorder.vectors, rtol=1e-6)
    assert response.texts == TEXTS
    assert response.meta.api_version.version == "1"
    assert response.meta.billed_units.input_tokens == 7


@pytest.mark.parametrize("kind", [cohere.Client, cohere.ClientV2])
def test_sdk_parses_every_type(recorded, kind: type) -> None:
    recorder, client = recorded
    response = client(kind).embed(
        texts=TEXTS, model="m", input_type="clustering", embedding_types=list(EMBEDDING_TYPES)
    )
    assert response.response_type == "embeddings_by_type"
    want = encode_embeddings(recorder.vectors, EMBEDDING_TYPES)
    for t in EMBEDDING_TYPES:
        got = _rows(response, t)
        if t == "base64":
            assert got == want[t]
        else:
            np.testing.assert_allclose(np.array(got), np.stack(want[t]), rtol=1e-6)
    assert response.meta.api_version.version == ("2" if kind is cohere.ClientV2 else "1")


def test_v2_defaults_to_float(recorded) -> None:
    recorder, client = recorded
    response = client(cohere.ClientV2).embed(
        texts=TEXTS, model="m", input_type="classification", embedding_types=None, truncate=None
    )
    # an explicit None goes out as null, which the schema takes as "default"
    sent = recorder.sent[0][1]
    assert sent["embedding_types"] is None and sent["truncate"] is None
    assert response.response_type == "embeddings_by_type"
    assert len(response.embeddings.float_) == 3 and response.embeddings.int8 is None


def test_prompt_for() -> None:
    e5 = {"query": "query: ", "passage": "passage: "}
    nomic = {n: n + ": " for n in PROMPT_NAMES}  # names the Cohere way
    assert prompt_for("search_query", e5) == "query"
    assert prompt_for("search_document", e5) == "passage"
    assert prompt_for("search_document", {"document": "d", "passage": "p"}) == "document"
    assert prompt_for("classification", e5) is None
    assert prompt_for("clustering", {"clustering": "c"}) == "clustering"
    assert prompt_for("search_query", nomic) == "search_query"
    assert prompt_for("search_query", {}) is None
    assert prompt_for(None, e5) is None
    assert prompt_for("image", e5) is None


def test_truncation_table() -> None:
    assert TRUNCATION == {"NONE": (False, "right"), "START": (True, "left"), "END": (True, "right")}


# ---- a real server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def co1(server: ServerProcess) -> cohere.Client:
    return cohere.Client(api_key=API_KEY, base_url=server.url, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def co2(server: ServerProcess) -> cohere.ClientV2:
    return cohere.ClientV2(api_key=API_KEY, base_url=server.url, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(minilm_path):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu")


def _encode(reference, texts: list[str], side: str = "right") -> np.ndarray:
    saved = reference.tokenizer.truncation_side
    reference.tokenizer.truncation_side = side
    try:
        return reference.encode(texts, normalize_embeddings=True)
    finally:
        reference.tokenizer.truncation_side = saved


def _close(got: Any, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float32)
    assert got.shape == want.shape
    cos = (got * want).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.9999, cos


def _tokens(reference, texts: list[str]) -> int:
    return sum(len(reference.tokenizer(t)["input_ids"]) for t in texts)


def test_v1_default_is_floats(co1: cohere.Client, reference) -> None:
    response = co1.embed(texts=TEXTS, model="minilm")
    assert response.response_type == "embeddings_floats"
    _close(response.embeddings, _encode(reference, TEXTS))
    assert np.allclose(np.linalg.norm(response.embeddings, axis=1), 1, atol=1e-5)
    assert response.texts == TEXTS
    assert response.id
    assert response.meta.api_version.version == "1"
    assert response.meta.billed_units.input_tokens == _tokens(reference, TEXTS)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_every_type_matches_reference_and_formulas(co1, co2, reference, version: str) -> None:
    kwargs: dict[str, Any] = {"texts": TEXTS, "model": "minilm", "input_type": "search_document"}
    response = (co1 if version == "v1" else co2).embed(
        embedding_types=list(EMBEDDING_TYPES), **kwargs
    )
    assert response.response_type == "embeddings_by_type"
    want = _encode(reference, TEXTS)
    floats = np.asarray(response.embeddings.float_, dtype=np.float32)
    _close(floats, want)
    # The other types are the documented functions of the float vector sent alongside...
    exact = encode_embeddings(floats, EMBEDDING_TYPES)
    for kind in ("int8", "uint8", "binary", "ubinary"):
        np.testing.assert_array_equal(np.array(_rows(response, kind)), np.stack(exact[kind]))
    assert response.embeddings.base64 == exact["base64"]
    decoded = [np.frombuffer(base64.b64decode(s), "<f4") for s in response.embeddings.base64]
    np.testing.assert_array_equal(np.stack(decoded), floats)
    # ...and of sentence-transformers' vector, up to rounding at a boundary.
    ref = encode_embeddings(want, EMBEDDING_TYPES)
    for kind in ("int8", "uint8"):
        diff = np.abs(np.array(_rows(response, kind), int) - np.stack(ref[kind]).astype(int))
        assert diff.max() <= 1, kind
    signs = np.unpackbits(np.array(_rows(response, "ubinary"), np.uint8), axis=1)[:, :384]
    flips = signs != (want > 0)
    assert np.all(np.abs(want[flips]) < 1e-4)
    assert response.meta.billed_units.input_tokens == _tokens(reference, TEXTS)
    assert response.texts == TEXTS


@pytest.mark.parametrize("kind", EMBEDDING_TYPES)
def test_v2_one_type_at_a_time(co2: cohere.ClientV2, kind: str) -> None:
    response = co2.embed(
        texts=TEXTS[:2], model="minilm", input_type="search_query", embedding_types=[kind]
    )
    rows = _rows(response, kind)
    assert len(rows) == 2
    others = [t for t in EMBEDDING_TYPES if t != kind]
    assert all(_rows(response, t) is None for t in others)
    width = {"binary": 48, "ubinary": 48}.get(kind, 384)
    if kind == "base64":
        assert len(base64.b64decode(rows[0])) == 4 * 384
    else:
        assert len(rows[0]) == width


@pytest.mark.parametrize("input_type", ["search_query", "search_document", "classification"])
def test_input_type_without_model_prompts(co2, reference, input_type: str) -> None:
    """MiniLM has no prompts: every input_type embeds the text as it is."""
    response = co2.embed(
        texts=TEXTS, model="minilm", input_type=input_type, embedding_types=["float"]
    )
    _close(response.embeddings.float_, _encode(reference, TEXTS))


def test_output_dimension(co1, co2, reference) -> None:
    want = _encode(reference, TEXTS)[:, :64]
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    response = co2.embed(
        texts=TEXTS,
        model="minilm",
        input_type="clustering",
        embedding_types=["float", "ubinary"],
        output_dimension=64,
    )
    _close(response.embeddings.float_, want)
    assert np.allclose(np.linalg.norm(response.embeddings.float_, axis=1), 1, atol=1e-5)
    assert [len(r) for r in response.embeddings.ubinary] == [8, 8, 8]
    # v1's SDK has no output_dimension argument; the route takes it all the same
    v1 = co1.embed(
        texts=TEXTS,
        model="minilm",
        request_options={"additional_body_parameters": {"output_dimension": 64}},
    )
    _close(v1.embeddings, want)


def test_truncate(co1, co2, reference) -> None:
    end = co2.embed(
        texts=[LONG], model="minilm", input_type="search_document", embedding_types=["float"]
    )
    _close(end.embeddings.float_, _encode(reference, [LONG]))  # END is the default
    start = co1.embed(texts=[LONG], model="minilm", truncate="START")
    _close(start.embeddings, _encode(reference, [LONG], side="left"))
    assert float(np.dot(start.embeddings[0], end.embeddings.float_[0])) < 0.99
    assert end.meta.billed_units.input_tokens == 256  # the tokens actually run
    with pytest.raises(ApiError) as refused:
        co2.embed(
            texts=[LONG],
            model="minilm",
            input_type="search_document",
            embedding_types=["float"],
            truncate="NONE",
        )
    assert "256" in _openai_error(refused.value, 400, None)["message"]


def _openai_error(error: ApiError, status: int, param: str | None) -> dict:
    assert error.status_code == status, error
    body = error.body["error"]
    assert set(body) == {"message", "type", "param", "code"}
    assert body["code"] == status and body["type"] == "invalid_request_error"
    assert body["message"]
    if param is not None:
        assert body["param"] == param, body
    return body


BAD_V2: list[tuple[dict[str, Any], int, str | None, str]] = [
    ({"embedding_types": ["float", "int4"]}, 422, "embedding_types", "should be 'float'"),
    ({"texts": []}, 422, "texts", "at least 1"),
    ({"texts": ["ok", ""]}, 422, "texts", "at least 1 character"),
    ({"output_dimension": 385}, 400, "output_dimension", "384"),
    ({"output_dimension": 0}, 422, "output_dimension", "greater than"),
    ({"truncate": "MIDDLE"}, 422, "truncate", "NONE"),
    ({"input_type": "search"}, 422, "input_type", "search_query"),
    ({"images": ["data:image/png;base64,AAAA"], "texts": None}, 400, "images", "image input"),
    ({"input_type": "image"}, 400, "input_type", "needs `images`"),
    ({"max_tokens": 16}, 400, "max_tokens", "256"),
    ({"model": "nope"}, 404, "model", "served models"),
    ({"model": "reranker"}, 400, "model", "reranking"),  # names what it serves
]


@pytest.mark.parametrize(("change", "status", "param", "words"), BAD_V2)
def test_bad_requests_v2(
    co2, server: ServerProcess, change: dict, status: int, param: str | None, words: str
) -> None:
    kwargs: dict[str, Any] = {
        "texts": TEXTS,
        "model": "minilm",
        "input_type": "search_query",
        "embedding_types": ["float"],
        **change,
    }
    if kwargs["texts"] is None:
        del kwargs["texts"]
    with pytest.raises(ApiError) as refused:
        co2.embed(**kwargs)
    error = refused.value
    assert error.status_code == status, error
    body = error.body["error"]
    assert set(body) == {"message", "type", "param", "code"} and body["code"] == status
    assert body["param"] == param, body
    assert words in body["message"], body
    assert httpx.get(server.url + "/health").status_code == 200


def test_bad_requests_v1(co1, server: ServerProcess) -> None:
    with pytest.raises(ApiError) as refused:
        co1.embed(texts=TEXTS, model="minilm", embedding_types=["uint4"])
    _openai_error(refused.value, 422, "embedding_types")
    with pytest.raises(ApiError) as refused:
        co1.embed(texts=[], model="minilm", batching=False)  # batching sends nothing for []
    _openai_error(refused.value, 422, "texts")
    with pytest.raises(ApiError) as refused:
        co1.embed(
            texts=TEXTS,
            model="minilm",
            request_options={"additional_body_parameters": {"output_dimension": 1000}},
        )
    _openai_error(refused.value, 400, "output_dimension")
    with pytest.raises(ApiError) as refused:
        co1.embed(images=["data:image/png;base64,AAAA"], model="minilm")
    _openai_error(refused.value, 400, "images")
    with server.client() as http:
        nothing = http.post("/v1/embed", json={"model": "minilm"})
        assert nothing.status_code == 422 and "texts" in nothing.json()["error"]["message"]
    # the server is fine afterwards
    assert httpx.get(server.url + "/health").status_code == 200
    assert co1.embed(texts=TEXTS[:1], model="minilm").response_type == "embeddings_floats"


def test_needs_the_api_key(server: ServerProcess) -> None:
    wrong = cohere.ClientV2(api_key="wrong", base_url=server.url, max_retries=0)
    with pytest.raises(ApiError) as refused:
        wrong.embed(texts=TEXTS, model="minilm", input_type="search_query")
    assert refused.value.status_code == 401


def test_plain_http_shapes(server: ServerProcess) -> None:
    """The wire shapes without the SDK: keys, types and lowercase truncate accepted."""
    with server.client() as http:
        v1 = http.post("/v1/embed", json={"texts": ["hi"], "truncate": "end"}).json()
        v2 = http.post(
            "/v2/embed", json={"texts": ["hi"], "model": "minilm", "embedding_types": ["int8"]}
        ).json()
    assert set(v1) == {"id", "response_type", "embeddings", "texts", "meta"}
    assert v1["response_type"] == "embeddings_floats" and len(v1["embeddings"][0]) == 384
    assert v2["response_type"] == "embeddings_by_type" and list(v2["embeddings"]) == ["int8"]
    assert all(isinstance(x, int) for x in v2["embeddings"]["int8"][0])
    assert v2["meta"] == {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 3}}
