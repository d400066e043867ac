"""sentence-transformers pipelines as 6.x writes them and as 5.x did: every Pooling mode (one,
several concatenated, without the prompt), Dense layers, Normalize where the files have it.
Each tiny model is saved by sentence-transformers' own save and served through the normal
loading path; its vectors are compared with ``SentenceTransformer(path).encode`` on every
backend that runs the dense kind (torch, onnx, ct2), in process and through `ember serve`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from ember.engine import EmbedRequest, SyncEngineArray
from tests.fixtures import st_pipelines as sp
from tests.support import ServerProcess, start_server
from tests.texts import mixed_texts

TEXTS = mixed_texts(40)
MIN_COSINE = 0.9999
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "cls-residual": sp.build_cls_residual,
    "all-modes": sp.build_all_modes_without_prompt,
    "st5-multi": sp.build_st5_multi_mode,
    "gemma": sp.build_embeddinggemma_like,
    "distiluse": sp.build_distiluse_like,
}
# What each serves: width, and how many modes its vector concatenates (compared apart).
SHAPES = {
    "cls-residual": (16, 1),
    "all-modes": (6 * sp.HIDDEN, 6),
    "st5-multi": (3 * sp.HIDDEN, 3),
    "gemma": (sp.HIDDEN, 1),
    "distiluse": (sp.DISTILUSE_WIDTH, 1),
}
PROMPTED = ("all-modes", "gemma")  # also compared with their query prompt


def cosines(got: np.ndarray, want: np.ndarray, parts: int = 1) -> np.ndarray:
    """Row cosines per concatenated part [rows, parts]: a wrong mode shows in its own part."""
    assert got.shape == want.shape
    g, w = (x.reshape(len(x), parts, -1) for x in (np.asarray(got), np.asarray(want)))
    return (g * w).sum(-1) / (np.linalg.norm(g, axis=-1) * np.linalg.norm(w, axis=-1))


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st-pipelines")
    return {name: build(root / name) for name, build in BUILDERS.items()}


@pytest.fixture(scope="module")
def references(paths: dict[str, Path]) -> dict[tuple[str, str | None], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    refs = {}
    for name, path in paths.items():
        st = SentenceTransformer(str(path), device="cpu")
        for prompt in (None, "query") if name in PROMPTED else (None,):
            refs[name, prompt] = st.encode(TEXTS, prompt_name=prompt, batch_size=8)
    return refs


def test_files_are_the_formats_they_mirror(paths: dict[str, Path]) -> None:
    """The 6.x saves are 6.x files and the 5.x spellings 5.x files (a fixture that wrote
    something else would test nothing)."""
    import json

    six = json.loads((paths["cls-residual"] / "1_Pooling" / "config.json").read_text())
    assert six == {"embedding_dimension": sp.HIDDEN, "pooling_mode": "cls", "include_prompt": True}
    modules = json.loads((paths["cls-residual"] / "modules.json").read_text())
    assert modules[2]["type"] == "sentence_transformers.base.modules.dense.Dense"
    five = json.loads((paths["distiluse"] / "1_Pooling" / "config.json").read_text())
    assert five["pooling_mode_mean_tokens"] is True and "pooling_mode" not in five
    assert (paths["distiluse"] / "2_Dense" / "pytorch_model.bin").exists()
    gemma = json.loads((paths["gemma"] / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in gemma] == [
        "Transformer", "Pooling", "Dense", "Dense", "Normalize"
    ]  # fmt: skip


def test_without_the_prompt_is_not_with_it(paths: dict[str, Path], references: dict) -> None:
    """include_prompt false changes the reference, so matching it means leaving the
    prompt out as sentence-transformers does."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(paths["all-modes"]), device="cpu")
    st[1].include_prompt = True
    with_prompt = st.encode(TEXTS, prompt_name="query", batch_size=8)
    cos = cosines(with_prompt, references["all-modes", "query"], 6)
    assert cos.min() < 0.99, cos.min(axis=0)


@pytest.fixture(scope="module", params=["torch", "onnx", "ct2"])
def served(
    request: pytest.FixtureRequest,
    paths: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SyncEngineArray]:
    with SyncEngineArray(
        model_id=[str(p) for p in paths.values()],
        served_model_name=list(paths),
        backend=request.param,
        device="cpu",
        cache_dir=str(tmp_path_factory.mktemp(f"cache-{request.param}")),
    ) as ember:
        yield ember


@pytest.mark.parametrize("name", list(BUILDERS))
def test_vectors_match_sentence_transformers(
    served: SyncEngineArray, references: dict, name: str
) -> None:
    width, parts = SHAPES[name]
    engine = served.engines.get(name)
    assert engine.model.hidden_size == width
    for prompt in (None, "query") if name in PROMPTED else (None,):
        got = np.stack(served._call(engine.embed(EmbedRequest(TEXTS, prompt_name=prompt))).outputs)
        assert got.shape == (len(TEXTS), width)
        cos = cosines(got, references[name, prompt], parts)
        worst = np.unravel_index(int(cos.argmin()), cos.shape)
        assert cos.min() >= MIN_COSINE, f"{prompt}: text {worst[0]} part {worst[1]}: {cos.min()}"


def test_prompted_and_plain_rows_in_one_batch(served: SyncEngineArray, references: dict) -> None:
    """Rows with and without the prompt share a batch; each pools its own positions."""
    engine = served.engines.get("all-modes")

    async def both() -> list:
        import asyncio

        return await asyncio.gather(
            engine.embed(EmbedRequest(TEXTS[:8], prompt_name="query")),
            engine.embed(EmbedRequest(TEXTS[:8])),
        )

    queries, plain = served._call(both())
    for result, prompt in ((queries, "query"), (plain, None)):
        got = np.stack(result.outputs)
        assert cosines(got, references["all-modes", prompt][:8], 6).min() >= MIN_COSINE


# ----------------------------------------------------------------- through `ember serve`


@pytest.fixture(scope="module")
def server(paths: dict[str, Path]) -> Iterator[ServerProcess]:
    models = ";".join(str(p) for p in paths.values())
    # The exact path (cosine >= 0.9999 to sentence-transformers on any CPU kind).
    args = ["--model-id", models, "--served-model-name", ";".join(paths), "--dtype", "float32"]
    with start_server(args) as s:
        yield s


def test_served_vectors_and_dimensions(server: ServerProcess, references: dict) -> None:
    with server.client() as client:
        listed = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        info = client.get("/info").json()
        for name, (width, parts) in SHAPES.items():
            assert listed[name]["dimensions"] == width
            body = {"model": name, "input": TEXTS}
            reply = client.post("/v1/embeddings", json=body)
            assert reply.status_code == 200, reply.text
            got = np.array([row["embedding"] for row in reply.json()["data"]])
            cos = cosines(got, references[name, None], parts)
            assert cos.min() >= MIN_COSINE, (name, cos.min())
        for name in PROMPTED:  # the query prompt, by TEI's prompt_name and Cohere's input_type
            tei = client.post(
                "/embed", json={"model": name, "inputs": TEXTS, "prompt_name": "query"}
            )
            openai = client.post(
                "/v1/embeddings", json={"model": name, "input": TEXTS, "input_type": "search_query"}
            )
            assert tei.status_code == openai.status_code == 200, (tei.text, openai.text)
            parts = SHAPES[name][1]
            for got in (np.array(tei.json()), [r["embedding"] for r in openai.json()["data"]]):
                cos = cosines(np.asarray(got), references[name, "query"], parts)
                assert cos.min() >= MIN_COSINE, (name, cos.min())
    assert info["model_id"] == "cls-residual" and info["dimensions"] == 16
    assert info["model_type"] == {"embedding": {"pooling": "cls"}}
    assert listed["all-modes"]["backend"] == "onnx"  # auto on CPU: the numpy heads did it


# ------------------------------------------------------------------ `ember export`


def test_export_keeps_the_pipeline(
    paths: dict[str, Path], references: dict, tmp_path: Path
) -> None:
    """An export directory resolves to the same pipeline (modes in order, prompt left out,
    Dense layers with their weights, Normalize) and serves the same vectors."""
    from ember.cli import main
    from ember.families.resolve import resolve_model
    from ember.models.spec import ModelSpec

    for name in ("all-modes", "gemma"):
        out = tmp_path / name
        args = ["export", "--model-id", str(paths[name]), "--backend", "onnx", "--output", str(out)]
        assert main(args) == 0
        source, exported = (resolve_model(ModelSpec(str(p))) for p in (paths[name], out))
        for field in ("poolings", "include_prompt", "normalize", "hidden_size", "max_length"):
            assert getattr(exported, field) == getattr(source, field), field
        widths = [(d.in_features, d.out_features) for d in exported.dense_layers]
        assert widths == [(d.in_features, d.out_features) for d in source.dense_layers]
        with SyncEngineArray(model_id=str(out), device="cpu", cache_dir=str(tmp_path)) as ember:
            got = ember.embed(TEXTS, prompt_name="query")
        cos = cosines(got, references[name, "query"], SHAPES[name][1])
        assert cos.min() >= MIN_COSINE, (name, cos.min())
