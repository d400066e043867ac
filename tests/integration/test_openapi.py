"""The OpenAPI schema tells the truth: every route lists the statuses it can answer with
the one error shape, and every documented 200 model fits what the route really answers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import TypeAdapter

from ember.api import app as a
from ember.api import errors as e
from ember.api.app import create_app
from ember.api.dialects import openai, tei
from ember.api.keys import UsageReport
from ember.api.routes import ROUTES, ROUTES_BY_PATH, TOKENIZER_ERRORS
from ember.config import settings_from_env
from tests.integration.test_fastpath_parity import BODIES, engines  # noqa: F401 (fixture)

ERROR_REF = "#/components/schemas/ErrorResponse"
GETS = {
    "/v1/models": (openai.ModelsResponse, {401}),
    "/info": (tei.InfoResponse, {401, 403}),
    "/ready": (a.ReadyResponse, {503}),
}
# Probes whose not-ready answer is a status of their own, not the error shape.
PROBES = {"/health": (a.HealthResponse, {503: a.HealthNotReady}), "/livez": (a.LiveResponse, {})}
# Bodies past BODIES: the other shapes a route answers.
MORE_BODIES: list[tuple[str, dict[str, Any]]] = [
    ("/rerank", {"model": "reranker", "query": "q", "documents": [{"text": "a"}, "b"]}),
    (
        "/rerank",
        {"model": "reranker", "query": "q", "documents": ["a", "b"], "return_documents": True},
    ),
    ("/rerank", {"model": "reranker", "query": "q", "texts": ["a", "b"], "top_n": 1}),
    (
        "/v1/rerank",
        {"model": "reranker", "query": "q", "documents": ["a", "b"], "return_documents": True},
    ),
    ("/predict", {"model": "classifier", "inputs": ["good", "bad"], "raw_scores": True}),
    ("/v1/embed", {"model": "minilm", "texts": ["a"], "embedding_types": ["float", "uint8"]}),
    ("/v1/embed", {"model": "minilm", "texts": ["a"], "embedding_types": ["binary"]}),
    ("/", {"model": "minilm", "inputs": ["a", "b"]}),
    ("/", {"model": "classifier", "inputs": "good"}),
    ("/", {"model": "reranker", "query": "q", "texts": ["a", "b"]}),
    ("/", {"model": "minilm", "inputs": {"source_sentence": "a", "sentences": ["b"]}}),
    ("/tokenize", {"model": "minilm", "inputs": ["a", "b"], "add_special_tokens": False}),
    ("/decode", {"model": "minilm", "ids": [101, 102]}),
]


def _spec() -> dict[str, Any]:
    return create_app(settings_from_env(model_id="unused")).openapi()


def _documented(adapter: TypeAdapter[Any], body: Any) -> Any:
    """The body as the model reads it back: equal to the body when every field of it is
    documented (pydantic ignores unknown fields; this finds them)."""
    parsed = adapter.validate_python(body)
    return adapter.dump_python(parsed, mode="json", by_alias=True, exclude_unset=True)


def test_every_route_lists_its_statuses_with_the_error_shape() -> None:
    spec = _spec()
    for route in ROUTES:
        for path in route.paths:
            responses = spec["paths"][path]["post"]["responses"]
            statuses = {*route.errors, *e.CONNECTION_ERRORS}
            assert set(responses) == {"200", *map(str, statuses)}, path
            for status in statuses:
                content = responses[str(status)]["content"]
                assert content == {"application/json": {"schema": {"$ref": ERROR_REF}}}, path
            assert "x-total-time" in responses["200"]["headers"]
            assert "WWW-Authenticate" in responses["401"]["headers"]
            if "429" in responses:
                assert "Retry-After" in responses["429"]["headers"]
    for path, (_, errors) in GETS.items():
        responses = spec["paths"][path]["get"]["responses"]
        statuses = {*errors, *e.CONNECTION_ERRORS}
        assert set(responses) == {"200", *map(str, statuses)}, path
        for status in statuses:
            assert responses[str(status)]["content"]["application/json"]["schema"] == {
                "$ref": ERROR_REF
            }
    for path, (_, others) in PROBES.items():
        responses = spec["paths"][path]["get"]["responses"]
        assert set(responses) == {"200", *map(str, others), *map(str, e.CONNECTION_ERRORS)}
        for status, model in others.items():
            schema = responses[str(status)]["content"]["application/json"]["schema"]
            assert schema == {"$ref": f"#/components/schemas/{model.__name__}"}, path
    usage = spec["paths"]["/admin/usage"]["get"]["responses"]
    assert set(usage) == {"200", "401", "403", *map(str, e.CONNECTION_ERRORS)}
    metrics = spec["paths"]["/metrics"]["get"]["responses"]
    assert set(metrics) == {"200", *map(str, e.CONNECTION_ERRORS)}
    assert list(metrics["200"]["content"]) == ["text/plain"]
    # FastAPI's own 422 shape ({"detail": [...]}) is never answered, so never documented.
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_model_route_statuses_come_from_the_route_table() -> None:
    assert ROUTES_BY_PATH["/tokenize"].errors == TOKENIZER_ERRORS
    assert 429 in ROUTES_BY_PATH["/v1/embeddings"].errors
    assert all(set(route.errors) <= set(e.ERROR_DESCRIPTIONS) for route in ROUTES)
    assert set(e.CONNECTION_ERRORS) <= set(e.ERROR_DESCRIPTIONS)


@pytest.mark.asyncio(loop_scope="session")
async def test_documented_models_fit_real_answers(engines: Any) -> None:  # noqa: F811
    settings, array = engines
    app = create_app(settings.model_copy(update={"api_key": "k"}), array)
    auth = {"Authorization": "Bearer k"}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=auth) as c:
        for path, body in [*BODIES.items(), *MORE_BODIES]:
            answer = await c.post(path, json=body)
            assert answer.status_code == 200, (path, answer.text)
            adapter = TypeAdapter(ROUTES_BY_PATH[path].answer)
            assert _documented(adapter, answer.json()) == answer.json(), (path, body)
        for path, (model, _) in {**GETS, **PROBES}.items():
            answer = await c.get(path)
            assert answer.status_code == 200, path
            assert _documented(TypeAdapter(model), answer.json()) == answer.json(), path
        metrics = await c.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain")

        errors = TypeAdapter(e.ErrorResponse)
        wrong = [
            (await c.post("/v1/embeddings", json={"model": "nope", "input": "a"}), 404),
            (await c.post("/embed", json={"model": "minilm", "inputs": []}), 422),
            (
                await c.post("/embed", content=b"{", headers={"content-type": "application/json"}),
                400,
            ),
            (await c.post("/embed_sparse", json={"model": "minilm", "inputs": "a"}), 400),
            (await c.post("/embed", json={"model": "minilm", "inputs": ["a"] * 10_000}), 413),
            (await c.post("/tokenize", json={"inputs": "a"}, headers={"Authorization": "x"}), 401),
            (await c.get("/v1/models", headers={"Authorization": "Bearer no"}), 401),
        ]
    for answer, status in wrong:
        assert answer.status_code == status, answer.text
        assert _documented(errors, answer.json()) == answer.json()
        assert answer.json()["error"]["code"] == status


@pytest.mark.asyncio(loop_scope="session")
async def test_integers_are_integers(engines: Any) -> None:  # noqa: F811
    """The schema says integer: true, "3" or 2.5 is 422, not read as 1, 3 or 2 (found by
    schemathesis' negative cases: `/embed` answered `dimensions: true` with a 1-d vector);
    2.0 is JSON Schema's integer 2 (schemathesis' positive cases send it)."""
    settings, array = engines
    fields = [
        ("/embed", {"model": "minilm", "inputs": "a"}, "dimensions"),
        ("/v1/embeddings", {"model": "minilm", "input": "a"}, "dimensions"),
        ("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["a"]}, "top_n"),
        ("/v2/embed", {"model": "minilm", "texts": ["a"]}, "output_dimension"),
        ("/v2/embed", {"model": "minilm", "texts": ["a"]}, "max_tokens"),
        ("/", {"model": "classifier", "inputs": "a", "parameters": {}}, "parameters.top_k"),
        ("/decode", {"model": "minilm"}, "ids"),
    ]
    transport = httpx.ASGITransport(app=create_app(settings, array))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        for path, body, field in fields:
            for value in (True, "3", 2.5):
                sent = {**body, "parameters": {"top_k": value}} if "." in field else body
                if "." not in field:
                    sent = {**body, field: [value] if field == "ids" else value}
                answer = await client.post(path, json=sent)
                assert answer.status_code == 422, (path, field, value, answer.text)
        whole = {"model": "reranker", "query": "q", "documents": ["a", "b"], "top_n": 1.0}
        answer = await client.post("/v1/rerank", json=whole)
        assert answer.status_code == 200 and len(answer.json()["results"]) == 1, answer.text


@pytest.mark.asyncio(loop_scope="session")
async def test_the_usage_report_fits_its_documented_model(engines: Any, tmp_path) -> None:  # noqa: F811
    from ember.api.keys import hash_key

    settings, array = engines
    keys = tmp_path / "keys.toml"
    keys.write_text(f'[[keys]]\nname = "ops"\nhash = "{hash_key("k")}"\nadmin = true\n')
    app = create_app(settings.model_copy(update={"api_keys_file": str(keys)}), array)
    transport = httpx.ASGITransport(app=app)
    auth = {"Authorization": "Bearer k"}
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=auth) as c:
        assert (await c.post("/v1/embeddings", json={"model": "minilm", "input": "a"})).is_success
        answer = await c.get("/admin/usage")
    assert answer.status_code == 200, answer.text
    adapter = TypeAdapter(UsageReport)
    assert _documented(adapter, answer.json()) == answer.json()
    assert answer.json()["keys"]["ops"]["inputs"] == 1


def test_a_keyed_server_names_its_key_on_every_guarded_operation() -> None:
    spec = create_app(settings_from_env(model_id="unused", api_key="k")).openapi()
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert spec["paths"]["/v1/embeddings"]["post"]["security"] == [{"bearer": []}]
    assert spec["paths"]["/admin/usage"]["get"]["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/health"]["get"]
    assert "security" not in _spec()["paths"]["/v1/embeddings"]["post"]  # no key: open


@pytest.mark.asyncio(loop_scope="session")
async def test_an_undeclared_method_is_405_with_every_method_the_path_has() -> None:
    app = create_app(settings_from_env(model_id="unused"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.request("OPTIONS", "/")
        root = await client.get("/")
    assert answer.status_code == 405 and answer.headers["allow"] == "GET, POST"
    assert root.status_code == 307 and root.headers["location"] == "/docs"
    assert set(_spec()["paths"]["/"]["get"]["responses"]) == {"307", *map(str, e.CONNECTION_ERRORS)}
