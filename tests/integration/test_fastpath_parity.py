"""Every model route answers the same through the fast path as through FastAPI's stack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from ember.api.app import create_app
from ember.api.routes import ROUTES
from ember.config import settings_from_env
from ember.engine import EngineArray
from tests.fixtures.media_samples import audio_data_uri, gradient_image, image_data_uri, sine

VOLATILE = {"id", "created"}  # differ between any two calls

BODIES: dict[str, dict[str, Any]] = {
    "/v1/embeddings": {"model": "minilm", "input": ["a cat", "a dog on a mat"]},
    "/embeddings": {"model": "minilm", "input": "one", "encoding_format": "base64"},
    "/v1/rerank": {"model": "reranker", "query": "q", "documents": ["a", "b c"], "top_n": 1},
    "/v2/rerank": {"model": "reranker", "query": "q", "documents": ["a", "b c"]},
    "/rerank": {"model": "reranker", "query": "q", "texts": ["a", "b c"], "return_text": True},
    "/score": {"model": "bge", "text_1": "q", "text_2": ["a", "b c"]},  # MaxSim
    "/v1/score": {"model": "reranker", "text_1": ["q", "r"], "text_2": ["a", "b c"]},
    "/classify": {"model": "classifier", "input": ["good", "bad movie"]},
    "/predict": {"model": "classifier", "inputs": "good"},
    "/embed": {"model": "minilm", "inputs": ["hi", "there"], "dimensions": 32},
    "/tokenize": {"model": "minilm", "inputs": "hello world"},
    "/decode": {"model": "minilm", "ids": [[101, 7592, 102], [2088]], "skip_special_tokens": False},
    "/similarity": {
        "model": "minilm",
        "inputs": {"source_sentence": "a cat", "sentences": ["a dog", "a mat"]},
    },
    "/": {"model": "classifier", "inputs": "good", "parameters": {"top_k": 1}},
    "/embed_sparse": {"model": "bge", "inputs": ["hi", "there"]},
    "/embed_all": {"model": "bge", "inputs": "hello world", "prompt_name": None},
    "/v1/embed": {"model": "minilm", "texts": ["a cat", "a dog on a mat"]},
    "/embeddings_image": {"model": "clip", "input": [image_data_uri(gradient_image(40, 30))]},
    "/embeddings_audio": {"model": "clap", "input": audio_data_uri(sine(440, 1.0), 48_000)},
    "/v2/embed": {
        "model": "minilm",
        "texts": ["hi"],
        "input_type": "search_query",
        "embedding_types": ["int8", "ubinary", "base64"],
        "output_dimension": 32,
    },
}


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    if isinstance(value, float):
        return round(value, 5)
    return value


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engines(
    minilm_path: Path,
    tiny_reranker_path: Path,
    tiny_classifier_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Any:
    from tests.fixtures.media_models import build_tiny_clap, build_tiny_clip
    from tests.fixtures.retrieval_models import build_tiny_bge_m3

    bge = build_tiny_bge_m3(tmp_path_factory.mktemp("bge"))
    clip, clap = build_tiny_clip(), build_tiny_clap()
    settings = settings_from_env(
        model_id=f"{minilm_path};{tiny_reranker_path};{tiny_classifier_path};{bge};{clip};{clap}",
        served_model_name="minilm;reranker;classifier;bge;clip;clap",
    )
    array = EngineArray(settings.model_specs())
    await array.start()
    yield settings, array
    await array.stop()


def test_every_model_path_has_a_body() -> None:
    assert {p for r in ROUTES for p in r.paths} == set(BODIES)


@pytest.mark.asyncio(loop_scope="session")  # the loop the engines run on
@pytest.mark.parametrize("path", sorted(BODIES))
async def test_fast_path_matches_fastapi(engines: Any, path: str) -> None:
    settings, array = engines
    app = create_app(settings, array)
    answers = []
    for asgi in (app, app.framework):
        transport = httpx.ASGITransport(app=asgi)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            good = await client.post(path, json=BODIES[path])
            bad = await client.post(path, json={"model": "minilm", "nonsense": 1})
        assert good.status_code == 200, good.text
        assert "x-total-time" in good.headers
        assert bad.status_code == 422 and bad.json()["error"]["type"] == "invalid_request_error"
        answers.append((_stable(good.json()), bad.json()))
    assert answers[0] == answers[1]


@pytest.mark.asyncio(loop_scope="session")
async def test_mounted_under_a_prefix(engines: Any) -> None:
    """Mounted (as adapters may), open paths stay open and model routes keep the fast path."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    settings, array = engines
    keyed = settings.model_copy(update={"api_key": "k"})
    outer = Starlette(routes=[Mount("/prefix", app=create_app(keyed, array))])
    transport = httpx.ASGITransport(app=outer)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/prefix/health")).status_code == 200
        body = BODIES["/v1/embeddings"]
        denied = await client.post("/prefix/v1/embeddings", json=body)
        assert denied.status_code == 401
        auth = {"Authorization": "Bearer k"}
        good = await client.post("/prefix/v1/embeddings", json=body, headers=auth)
        assert good.status_code == 200 and len(good.json()["data"]) == 2
        metrics = (await client.get("/prefix/metrics")).text
    assert 'route="/v1/embeddings",status="200"' in metrics
    assert 'route="/health"' in metrics


@pytest.mark.asyncio(loop_scope="session")
async def test_score_is_the_rerank_score_for_maxsim_and_cross_encoders(engines: Any) -> None:
    """/score runs the rerank path: a late-interaction model's MaxSim (BGE-M3's ColBERT head)
    and a cross-encoder's score, pair by pair, equal /v1/rerank's."""
    settings, array = engines
    app = create_app(settings, array)
    docs = ["a cat on a mat", "dogs bark", "a kitten sleeps"]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        for model in ("bge", "reranker"):
            scored = await c.post("/score", json={"model": model, "text_1": "cat", "text_2": docs})
            ranked = await c.post(
                "/v1/rerank", json={"model": model, "query": "cat", "documents": docs}
            )
            assert scored.status_code == ranked.status_code == 200, scored.text
            by_index = {r["index"]: r["relevance_score"] for r in ranked.json()["results"]}
            assert [d["score"] for d in scored.json()["data"]] == pytest.approx(
                [by_index[i] for i in range(len(docs))], abs=1e-6
            )
