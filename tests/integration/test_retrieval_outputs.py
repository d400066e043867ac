"""Multi-vector (ColBERT), sparse (SPLADE) and BGE-M3's three heads through a real
`ember serve`, against references computed from the same weights
(tests/fixtures/references.py: PyLate's algorithm, sentence-transformers' SparseEncoder,
FlagEmbedding's BGE-M3 algorithm), relative error <= 1e-4."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ember.engine import EmbedRequest
from tests.fixtures import references as ref
from tests.fixtures.retrieval_models import build_tiny_bge_m3, build_tiny_colbert, build_tiny_splade
from tests.support import ServerProcess, start_server

TEXTS = [
    "Hello, world!",
    "A longer document about cats, dogs; and other animals, told twice. " * 3,
    "q?",
    "Retrieval with late interaction scores every query token.",
]
QUERY = "what about cats and dogs?"
RTOL = 1e-4


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("retrieval")
    return {
        "colbert": build_tiny_colbert(root / "colbert"),
        "splade": build_tiny_splade(root / "splade"),
        "bge": build_tiny_bge_m3(root / "bge"),
    }


@pytest.fixture(scope="module")
def server(paths: dict[str, Path]) -> Iterator[ServerProcess]:
    models = ";".join(str(paths[n]) for n in ("colbert", "splade", "bge"))
    with start_server(["--model-id", models, "--served-model-name", "colbert;splade;bge"]) as s:
        yield s


def close(got: np.ndarray, want: np.ndarray) -> None:
    """Relative error <= RTOL, measured against the largest reference value."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    scale = max(float(np.abs(want).max()), 1e-12)
    assert float(np.abs(got - want).max()) <= RTOL * scale


def post(server: ServerProcess, path: str, body: dict) -> object:
    with server.client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


def refused(server: ServerProcess, path: str, body: dict, status: int = 400) -> str:
    """The OpenAI error shape, and the server still healthy after."""
    with server.client() as client:
        response = client.post(path, json=body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == status
        assert client.get("/health").status_code == 200
    return error["message"]


# ------------------------------------------------------------------------------ ColBERT


@pytest.mark.parametrize("input_type", ["search_document", "search_query"])
def test_colbert_openai_embeddings_match_pylate(
    server: ServerProcess, paths: dict[str, Path], input_type: str
) -> None:
    is_query = input_type == "search_query"
    want = ref.colbert_encode(paths["colbert"], TEXTS, is_query)
    body = {"model": "colbert", "input": TEXTS, "input_type": input_type}
    data = post(server, "/v1/embeddings", body)["data"]  # type: ignore[index]
    for item, expected in zip(data, want, strict=True):
        close(np.array(item["embedding"]), expected)
    # base64: the float32 [n, dim] array, flattened, little-endian
    data = post(server, "/embeddings", {**body, "encoding_format": "base64"})["data"]  # type: ignore[index]
    for item, expected in zip(data, want, strict=True):
        flat = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        close(flat.reshape(expected.shape), expected)


def test_colbert_default_is_document_and_queries_expand(
    server: ServerProcess, paths: dict[str, Path]
) -> None:
    data = post(server, "/v1/embeddings", {"model": "colbert", "input": ["hi"]})["data"]  # type: ignore[index]
    close(np.array(data[0]["embedding"]), ref.colbert_encode(paths["colbert"], ["hi"], False)[0])
    query = post(
        server, "/v1/embeddings", {"model": "colbert", "input": "hi", "input_type": "search_query"}
    )["data"][0]["embedding"]  # type: ignore[index]
    assert len(query) == 16  # query_length: [CLS] [Q] hi [SEP] + 12 [MASK] expansions


@pytest.mark.parametrize("prompt_name", ["query", "document"])
def test_colbert_tei_embed_all(
    server: ServerProcess, paths: dict[str, Path], prompt_name: str
) -> None:
    want = ref.colbert_encode(paths["colbert"], TEXTS, prompt_name == "query")
    body = {"model": "colbert", "inputs": TEXTS, "prompt_name": prompt_name}
    got = post(server, "/embed_all", body)
    for matrix, expected in zip(got, want, strict=True):  # type: ignore[arg-type]
        close(np.array(matrix), expected)


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank", "/rerank"])
def test_maxsim_rerank_matches_pylate(
    server: ServerProcess, paths: dict[str, Path], path: str
) -> None:
    q = ref.colbert_encode(paths["colbert"], [QUERY], True)[0]
    want = [ref.maxsim(q, d) for d in ref.colbert_encode(paths["colbert"], TEXTS, False)]
    body = {"model": "colbert", "query": QUERY, "documents": TEXTS, "return_documents": True}
    results = post(server, path, body)["results"]  # type: ignore[index]
    assert [r["index"] for r in results] == list(np.argsort(-np.array(want), kind="stable"))
    for r in results:
        close(np.array(r["relevance_score"]), np.array(want[r["index"]]))
        text = TEXTS[r["index"]]  # Infinity's /rerank: the string; Cohere's: {"text"}
        assert r["document"] == (text if path == "/rerank" else {"text": text})
    tei = post(server, "/rerank", {"model": "colbert", "query": QUERY, "texts": TEXTS})
    for r in tei:  # type: ignore[union-attr]
        close(np.array(r["score"]), np.array(want[r["index"]]))


# ------------------------------------------------------------------------------- SPLADE


def test_splade_embed_sparse_matches_sparse_encoder(
    server: ServerProcess, paths: dict[str, Path]
) -> None:
    want = ref.splade_encode(paths["splade"], TEXTS)
    got = post(server, "/embed_sparse", {"model": "splade", "inputs": TEXTS})
    for entries, expected in zip(got, want, strict=True):  # type: ignore[arg-type]
        indices = [e["index"] for e in entries]
        assert indices == sorted(indices) and all(e["value"] > 0 for e in entries)
        assert indices == np.nonzero(expected)[0].tolist()  # zeros dropped, nothing else
        close(np.array([e["value"] for e in entries]), expected[indices])


def test_splade_openai_embeddings_are_indices_and_values(
    server: ServerProcess, paths: dict[str, Path]
) -> None:
    want = ref.splade_encode(paths["splade"], TEXTS[:2])
    data = post(server, "/v1/embeddings", {"model": "splade", "input": TEXTS[:2]})["data"]  # type: ignore[index]
    for item, expected in zip(data, want, strict=True):
        sparse = item["embedding"]
        assert sparse["indices"] == np.nonzero(expected)[0].tolist()
        close(np.array(sparse["values"]), expected[sparse["indices"]])


# ------------------------------------------------------------------------------- BGE-M3


def test_bge_m3_serves_three_heads(server: ServerProcess, paths: dict[str, Path]) -> None:
    want = ref.bge_m3_encode(paths["bge"], TEXTS)
    dense = post(server, "/v1/embeddings", {"model": "bge", "input": TEXTS})["data"]  # type: ignore[index]
    close(np.array([d["embedding"] for d in dense]), np.stack(want["dense_vecs"]))
    close(
        np.array(post(server, "/embed", {"model": "bge", "inputs": TEXTS})),
        np.stack(want["dense_vecs"]),
    )
    sparse = post(server, "/embed_sparse", {"model": "bge", "inputs": TEXTS})
    for entries, lexical in zip(sparse, want["lexical_weights"], strict=True):  # type: ignore[arg-type]
        assert [e["index"] for e in entries] == sorted(int(k) for k in lexical)
        close(
            np.array([e["value"] for e in entries]),
            np.array([lexical[str(e["index"])] for e in entries]),
        )
    multi = post(server, "/embed_all", {"model": "bge", "inputs": TEXTS})
    for matrix, expected in zip(multi, want["colbert_vecs"], strict=True):  # type: ignore[arg-type]
        close(np.array(matrix), expected)


def test_bge_m3_reranks_by_maxsim(server: ServerProcess, paths: dict[str, Path]) -> None:
    q = ref.bge_m3_encode(paths["bge"], [QUERY])["colbert_vecs"][0]
    docs = ref.bge_m3_encode(paths["bge"], TEXTS)["colbert_vecs"]
    want = [ref.maxsim(q, d) for d in docs]
    results = post(server, "/v1/rerank", {"model": "bge", "query": QUERY, "documents": TEXTS})
    for r in results["results"]:  # type: ignore[index]
        close(np.array(r["relevance_score"]), np.array(want[r["index"]]))


# ---------------------------------------------------------------------------- the edges


def test_models_list_capabilities(server: ServerProcess) -> None:
    with server.client() as client:
        models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert models["colbert"]["capabilities"] == ["embed", "embed_multi", "rerank"]
    assert models["splade"]["capabilities"] == ["embed", "embed_sparse"]
    assert models["bge"]["capabilities"] == ["embed", "embed_sparse", "embed_multi", "rerank"]


def test_bad_inputs_on_the_new_routes(server: ServerProcess) -> None:
    message = refused(server, "/embed_sparse", {"model": "colbert", "inputs": "x"})
    assert "no sparse head" in message and "multi-vector embeddings" in message
    message = refused(server, "/embed_all", {"model": "splade", "inputs": "x"})
    assert "no multi-vector head" in message and "sparse embeddings" in message
    message = refused(
        server, "/v1/embeddings", {"model": "splade", "input": "x", "encoding_format": "base64"}
    )
    assert "base64" in message and "indices and values" in message
    message = refused(server, "/v1/embeddings", {"model": "colbert", "input": "x", "dimensions": 8})
    assert "dense embeddings" in message
    message = refused(server, "/embed", {"model": "splade", "inputs": "x"})
    assert "no dense-embedding head" in message
    message = refused(server, "/v1/rerank", {"model": "splade", "query": "q", "documents": ["d"]})
    assert "does not rerank" in message
    refused(server, "/embed_sparse", {"model": "splade", "inputs": []}, status=422)
    refused(server, "/v1/embeddings", {"model": "bge", "input": "x", "input_type": "bogus"}, 422)


# ------------------------------------------------- the other backends, in process


@pytest.mark.parametrize("backend", ["torch", "ct2"])
def test_sparse_and_multi_heads_on_other_backends(paths: dict[str, Path], backend: str) -> None:
    """The server above runs the default (auto: onnx); the heads are the same on every
    backend since backends only return token states."""
    from ember.engine import SyncEngineArray

    want = ref.bge_m3_encode(paths["bge"], TEXTS)
    with SyncEngineArray(model_id=str(paths["bge"]), backend=backend, device="cpu") as ember:
        engine = ember.engines.get(None)
        sparse = ember._call(engine.embed(EmbedRequest(TEXTS, output="sparse"))).outputs
        multi = ember._call(engine.embed(EmbedRequest(TEXTS, output="multi"))).outputs
    for got, lexical in zip(sparse, want["lexical_weights"], strict=True):
        assert got.indices.tolist() == sorted(int(k) for k in lexical)
        close(got.values, np.array([lexical[str(i)] for i in got.indices]))
    for got, expected in zip(multi, want["colbert_vecs"], strict=True):
        close(got, expected)
    splade = ref.splade_encode(paths["splade"], TEXTS)
    with SyncEngineArray(model_id=str(paths["splade"]), backend=backend, device="cpu") as ember:
        for got, expected in zip(ember.embed(TEXTS), splade, strict=True):
            close(got.values, expected[got.indices])
            assert got.indices.tolist() == np.nonzero(expected)[0].tolist()


def test_colbert_on_torch_and_refused_on_ct2(paths: dict[str, Path]) -> None:
    from ember.engine import SyncEngineArray
    from ember.errors import ConfigError

    want = ref.colbert_encode(paths["colbert"], TEXTS, True)
    with SyncEngineArray(model_id=str(paths["colbert"]), backend="torch", device="cpu") as ember:
        engine = ember.engines.get(None)
        got = ember._call(engine.embed(EmbedRequest(TEXTS, query=True))).outputs
    for g, w in zip(got, want, strict=True):
        close(g, w)
    with pytest.raises(ConfigError, match="query-expansion positions masked"):
        SyncEngineArray(model_id=str(paths["colbert"]), backend="ct2", device="cpu")
