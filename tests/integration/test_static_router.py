"""StaticEmbedding and Router models (tests/fixtures/static_models.py: tiny seeded copies of
static-retrieval-mrl-en-v1, potion-base-8M, Router.for_query_document and OpenSearch's
inference-free sparse model, saved by sentence-transformers' own save) served by a real
`ember serve` and compared with ``SentenceTransformer(path).encode`` /
``encode_query`` / ``encode_document`` and ``SparseEncoder``: cosine >= 0.9999 for vectors,
the same nonzero ids and values within 1e-4 for sparse ones.

Static tables run on numpy alone: the static server must never map torch or ONNX Runtime,
and torch, onnx and ct2 refuse a static model in one line. A Router's transformer route runs
on the backend asked for (each checked here), its static route on numpy.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from ember.engine import EmbedRequest, SyncEngineArray
from ember.errors import ConfigError
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec
from tests.fixtures import static_models as sm
from tests.support import ServerProcess, refused_start, start_server
from tests.texts import mixed_texts

TEXTS = mixed_texts(40)  # short, unicode, whitespace only (no tokens), 600 tokens long
MIN_COSINE = 0.9999
SPARSE_ATOL = 1e-4
STATIC: dict[str, Callable[[Path], Path]] = {
    "static-mrl": sm.build_static_retrieval_like,
    "potion": sm.build_potion_like,
    "potion-quantized": lambda p: sm.build_potion_like(p, quantized=True),
    "static-dense": sm.build_static_dense,
}
ROUTERS: dict[str, Callable[[Path], Path]] = {
    "router": sm.build_query_document_router,
    "router-query-default": sm.build_query_default_router,
}
SPARSE = "inference-free"
SIDES = ("query", "document", None)  # None: neither said, the Router's default route


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("static-router")
    built = {name: build(root / name) for name, build in {**STATIC, **ROUTERS}.items()}
    built[SPARSE] = sm.build_inference_free_sparse(root / SPARSE)
    return built


def _dense(array: object) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


@pytest.fixture(scope="module")
def references(paths: dict[str, Path]) -> dict[tuple[str, str | None], object]:
    """(model, side) -> what sentence-transformers encodes."""
    from sentence_transformers import SentenceTransformer, SparseEncoder

    refs: dict[tuple[str, str | None], object] = {}
    for name in STATIC:
        st = SentenceTransformer(str(paths[name]), device="cpu")
        refs[name, None] = _dense(st.encode(TEXTS, batch_size=8))
        if name == "static-mrl":
            refs[name, "mrl"] = _dense(st.encode(TEXTS, truncate_dim=sm.MATRYOSHKA))
    for name in ROUTERS:
        st = SentenceTransformer(str(paths[name]), device="cpu")
        refs[name, "query"] = _dense(st.encode_query(TEXTS, batch_size=8))
        refs[name, "document"] = _dense(st.encode_document(TEXTS, batch_size=8))
        refs[name, None] = _dense(st.encode(TEXTS, batch_size=8))
    sparse = SparseEncoder(str(paths[SPARSE]), device="cpu")
    for side, encode in (("query", sparse.encode_query), ("document", sparse.encode_document)):
        refs[SPARSE, side] = encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    refs[SPARSE, None] = sparse.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    return refs


def cosines(got: object, want: object) -> np.ndarray:
    """Row cosines; a row with no tokens is the zero vector on both sides (1.0 then)."""
    g, w = _dense(got), _dense(want)
    assert g.shape == w.shape
    norms = np.linalg.norm(g, axis=1) * np.linalg.norm(w, axis=1)
    empty = np.linalg.norm(w, axis=1) < 1e-12
    assert (np.linalg.norm(g, axis=1)[empty] < 1e-6).all()
    return np.where(empty, 1.0, (g * w).sum(1) / np.where(empty, 1.0, norms))


def assert_sparse(got: list[tuple[list[int], list[float]]], want: np.ndarray) -> None:
    """Per text: the reference's nonzero ids exactly, values within SPARSE_ATOL."""
    assert len(got) == len(want)
    for row, ((indices, values), expected) in enumerate(zip(got, want, strict=True)):
        assert indices == np.nonzero(expected)[0].tolist(), f"text {row}"
        assert np.abs(np.array(values) - expected[indices]).max(initial=0) <= SPARSE_ATOL, row


def test_files_are_the_layouts_they_mirror(paths: dict[str, Path]) -> None:
    """The fixtures hold what the real checkpoints hold (else matching proves little)."""
    from safetensors import safe_open

    modules = json.loads((paths["static-mrl"] / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["0_StaticEmbedding"]
    tokenizer = json.loads((paths["static-mrl"] / "0_StaticEmbedding/tokenizer.json").read_text())
    assert tokenizer["truncation"] is None  # static-retrieval-mrl-en-v1 truncates nothing
    with safe_open(str(paths["potion-quantized"] / "model.safetensors"), "numpy") as f:
        assert sorted(f.keys()) == ["embeddings", "mapping", "weights"]
    router = json.loads((paths["router"] / "router_config.json").read_text())
    assert router["structure"] == {
        "query": ["query_0_StaticEmbedding"],
        "document": ["document_0_Transformer", "document_1_Pooling"],
    }
    assert router["parameters"]["default_route"] == "document"
    sparse = json.loads((paths[SPARSE] / "router_config.json").read_text())
    assert [t.rsplit(".", 1)[-1] for t in sparse["types"].values()] == [
        "SparseStaticEmbedding", "Transformer", "SpladePooling"
    ]  # fmt: skip
    pooling = json.loads((paths[SPARSE] / "document_1_SpladePooling/config.json").read_text())
    assert pooling["activation_function"] == "log1p_relu"


def test_the_sides_differ(references: dict) -> None:
    """Each side's reference is its own (a server on one route for both would fail)."""
    for name in (*ROUTERS, SPARSE):
        q, d = (np.asarray(references[name, s]) for s in ("query", "document"))
        assert not np.allclose(q, d, atol=1e-3), name
    # Neither side said: the default (document) route without the document prompt.
    assert not np.allclose(references["router", None], references["router", "document"])
    assert np.allclose(
        references["router-query-default", None], references["router-query-default", "query"]
    )


# ------------------------------------------------------------- static, on numpy alone


@pytest.fixture(scope="module")
def static_server(paths: dict[str, Path]) -> Iterator[ServerProcess]:
    models = ";".join(str(paths[n]) for n in STATIC)
    with start_server(["--model-id", models, "--served-model-name", ";".join(STATIC)]) as s:
        yield s


def test_static_vectors_match_sentence_transformers(
    static_server: ServerProcess, references: dict
) -> None:
    with static_server.client() as client:
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        for name in STATIC:
            assert listed[name]["backend"] == "numpy" and listed[name]["kind"] == "static"
            reply = client.post("/v1/embeddings", json={"model": name, "input": TEXTS})
            assert reply.status_code == 200, reply.text
            got = [row["embedding"] for row in reply.json()["data"]]
            cos = cosines(got, references[name, None])
            assert cos.min() >= MIN_COSINE, (name, int(cos.argmin()), cos.min())
        assert listed["static-mrl"]["dimensions"] == sm.STATIC_WIDTH
        assert listed["static-dense"]["dimensions"] == sm.HIDDEN
        mrl = {"model": "static-mrl", "input": TEXTS, "dimensions": sm.MATRYOSHKA}
        reply = client.post("/v1/embeddings", json=mrl)
        got = [row["embedding"] for row in reply.json()["data"]]
        assert cosines(got, references["static-mrl", "mrl"]).min() >= MIN_COSINE


def test_static_server_never_loads_torch(static_server: ServerProcess) -> None:
    """What the server process has mapped after serving: no libtorch, no ONNX Runtime."""
    with static_server.client() as client:
        reply = client.post("/embed", json={"model": "potion", "inputs": ["warm"]})
        assert reply.status_code == 200, reply.text
    maps = Path(f"/proc/{static_server.process.pid}/maps").read_text()
    assert "numpy" in maps  # the right process, reading its own libraries
    loaded = {line.rsplit("/", 1)[-1] for line in maps.splitlines() if ".so" in line}
    assert not {so for so in loaded if "libtorch" in so or "onnxruntime" in so}, loaded


def test_other_backends_refuse_a_static_model(paths: dict[str, Path]) -> None:
    """torch, onnx and ct2 refuse at start in one line naming the kind and what to use;
    numpy refuses a transformer the same way."""
    from ember.backends import load_backend

    for backend in ("torch", "onnx", "ct2"):
        model = resolve_model(ModelSpec(str(paths["potion"]), backend=backend))
        with pytest.raises(ConfigError, match=r"static model.*use --backend numpy or auto"):
            load_backend(model)
    bert = paths["router"] / "document_0_Transformer"
    model = resolve_model(ModelSpec(str(bert), backend="numpy", pooling="mean"))
    with pytest.raises(
        ConfigError,
        match=r"dense model, served by --backend torch or onnx or ct2 or neuron \(not numpy\)",
    ):
        load_backend(model)
    errors = refused_start(["--model-id", str(paths["static-mrl"]), "--backend", "onnx"])
    assert len(errors) == 1 and "is a static model" in errors[0], errors


# ------------------------------------------------------------------ Routers, served


@pytest.fixture(scope="module")
def router_server(paths: dict[str, Path]) -> Iterator[ServerProcess]:
    names = [*ROUTERS, SPARSE]
    models = ";".join(str(paths[n]) for n in names)
    # The exact path for the transformer routes (cosine >= 0.9999 on any CPU kind).
    args = ["--model-id", models, "--served-model-name", ";".join(names), "--dtype", "float32"]
    with start_server(args) as s:
        yield s


def _side_bodies(name: str, side: str | None) -> list[tuple[str, dict]]:
    """Every way a client picks a side: OpenAI/Cohere input_type, TEI prompt_name."""
    openai: dict = {"model": name, "input": TEXTS}
    tei: dict = {"model": name, "inputs": TEXTS}
    if side is not None:
        openai["input_type"] = f"search_{side}"
        tei["prompt_name"] = side
    return [("/v1/embeddings", openai), ("/embed" if name != SPARSE else "/embed_sparse", tei)]


@pytest.mark.parametrize("side", SIDES)
def test_dense_routers_match_encode_query_and_document(
    router_server: ServerProcess, references: dict, side: str | None
) -> None:
    with router_server.client() as client:
        for name in ROUTERS:
            for path, body in _side_bodies(name, side):
                reply = client.post(path, json=body)
                assert reply.status_code == 200, reply.text
                data = reply.json()
                got = [r["embedding"] for r in data["data"]] if path == "/v1/embeddings" else data
                cos = cosines(got, references[name, side])
                assert cos.min() >= MIN_COSINE, (name, path, side, int(cos.argmin()), cos.min())


@pytest.mark.parametrize("side", SIDES)
def test_inference_free_sparse_matches_sparse_encoder(
    router_server: ServerProcess, references: dict, side: str | None
) -> None:
    with router_server.client() as client:
        for path, body in _side_bodies(SPARSE, side):
            reply = client.post(path, json=body)
            assert reply.status_code == 200, reply.text
            if path == "/v1/embeddings":
                got = [
                    (r["embedding"]["indices"], r["embedding"]["values"])
                    for r in reply.json()["data"]
                ]
            else:
                got = [
                    ([e["index"] for e in row], [e["value"] for e in row]) for row in reply.json()
                ]
            assert_sparse(got, np.asarray(references[SPARSE, side]))


def test_routers_listed_with_their_routes(router_server: ServerProcess) -> None:
    with router_server.client() as client:
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    router = listed["router"]
    assert router["kind"] == "router" and router["dimensions"] == sm.HIDDEN
    assert router["backend"] == "numpy+onnx"  # auto: the document side on onnx
    assert router["backend_details"]["route query"].startswith("numpy")
    assert listed[SPARSE]["kind"] == "sparse-router"
    assert listed[SPARSE]["capabilities"] == ["embed", "embed_sparse"]


# ------------------------------------------- every backend the document route runs on


@pytest.fixture(scope="module", params=["torch", "onnx", "ct2"])
def routers_on(
    request: pytest.FixtureRequest,
    paths: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SyncEngineArray]:
    names = [*ROUTERS, SPARSE]
    with SyncEngineArray(
        model_id=[str(paths[n]) for n in names],
        served_model_name=names,
        backend=request.param,
        device="cpu",
        cache_dir=str(tmp_path_factory.mktemp(f"cache-{request.param}")),
    ) as ember:
        yield ember


def test_routers_on_every_backend(routers_on: SyncEngineArray, references: dict) -> None:
    for name in (*ROUTERS, SPARSE):
        engine = routers_on.engines.get(name)
        assert engine.backend is not None
        routes = engine.backend.backends  # type: ignore[attr-defined]
        assert {r: b.info.name for r, b in routes.items()}["query"] == "numpy"
        for side in SIDES:
            # As TEI's prompt_name picks it, and as the embedded query=True/False does (the
            # side's prompt too, as encode_query/encode_document apply it).
            calls = {
                "prompt_name": engine.embed(EmbedRequest(TEXTS, prompt_name=side)),
                "query": engine.embed(
                    EmbedRequest(TEXTS, query={"query": True, "document": False}.get(side))
                ),
            }
            for how, call in calls.items():
                rows = routers_on._call(call).outputs
                if name == SPARSE:
                    got = [(r.indices.tolist(), r.values.tolist()) for r in rows]
                    assert_sparse(got, np.asarray(references[name, side]))
                else:
                    cos = cosines(np.stack(rows), references[name, side])
                    assert cos.min() >= MIN_COSINE, (name, side, how, cos.min())


# ------------------------------------------------------------- what is refused at start


def _edited_router(source: Path, target: Path, edit: Callable[[dict], None]) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "router_config.json").read_text())
    edit(config)
    (target / "router_config.json").write_text(json.dumps(config))
    return target


def test_unsupported_routes_are_refused_at_start(paths: dict[str, Path], tmp_path: Path) -> None:
    def cnn_query(config: dict) -> None:
        config["types"]["query_0_StaticEmbedding"] = "sentence_transformers.models.CNN"

    def mixed(config: dict) -> None:  # a sparse query side beside a dense document side
        config["types"]["query_0_StaticEmbedding"] = (
            "sentence_transformers.sparse_encoder.modules.SparseStaticEmbedding"
        )

    def no_default(config: dict) -> None:
        config["parameters"].update(default_route=None, allow_empty_key=False)

    cases = {
        "starts with CNN; Ember serves Router routes that start with": cnn_query,
        "the routes return dense and sparse embeddings": mixed,
        "no default route": no_default,
    }
    for index, (message, edit) in enumerate(cases.items()):
        target = _edited_router(paths["router"], tmp_path / str(index), edit)
        if edit is mixed:  # the IDF table and tokenizer where the static one was
            query = target / "query_0_StaticEmbedding"
            shutil.rmtree(query)
            shutil.copytree(paths[SPARSE] / "query_0_SparseStaticEmbedding", query)
        with pytest.raises(ConfigError, match=message):
            resolve_model(ModelSpec(str(target)))


def test_route_mappings_pick_the_sides_as_router_does(
    paths: dict[str, Path], tmp_path: Path
) -> None:
    """Routes named by route_mappings, resolved in Router._resolve_route's order:
    (task, "text"), (task, None), (None, "text"), (None, None), then the task's own name."""

    def renamed(config: dict) -> None:
        config["structure"] = {
            "q": config["structure"]["query"],
            "d": config["structure"]["document"],
        }
        config["parameters"].update(
            default_route="q", route_mappings={"('query', 'text')": "q", "(None, None)": "d"}
        )

    target = _edited_router(paths["router"], tmp_path / "mapped", renamed)
    routes = resolve_model(ModelSpec(str(target))).facts
    assert routes is not None
    # A document and an unmarked input both match (None, None) before the default route.
    assert (routes.query, routes.document, routes.default) == ("q", "d", "d")
