"""Text encoders that are not BERT-shaped, served by `ember serve` as sentence-transformers
encodes them: a T5 encoder in sentence-transformers/gtr-t5-base's layout (sentence-t5-base
has the same) and EmbeddingGemma (google/embeddinggemma-300m's Gemma3 network, Dense layers
and prompts), each a tiny seeded copy saved by sentence-transformers' own save
(``tests/fixtures/st_pipelines``), on torch, onnx and auto; ct2 refuses both at start.

One server per model and backend; onnx and auto share a cache, so auto opens the graph onnx
built.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures import st_pipelines as sp
from tests.support import ServerProcess, start_server
from tests.texts import mixed_texts

TEXTS = mixed_texts(40)
MIN_COSINE = 0.9999
BUILDERS = {"gtr": sp.build_gtr_like, "gemma": sp.build_embeddinggemma}


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("encoders")
    return {name: build(root / name) for name, build in BUILDERS.items()}


@pytest.fixture(scope="module")
def references(paths: dict[str, Path]) -> dict[tuple[str, str | None], np.ndarray]:
    from sentence_transformers import SentenceTransformer

    gtr = SentenceTransformer(str(paths["gtr"]), device="cpu")
    gemma = SentenceTransformer(str(paths["gemma"]), device="cpu")
    return {
        ("gtr", None): gtr.encode(TEXTS, batch_size=8),
        ("gemma", None): gemma.encode(TEXTS, batch_size=8),
        ("gemma", "query"): gemma.encode(TEXTS, prompt_name="query", batch_size=8),
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


SERVED = [(name, backend) for name in BUILDERS for backend in ("torch", "onnx", "auto")]


@pytest.fixture(scope="module", params=SERVED, ids=[f"{n}-{b}" for n, b in SERVED])
def server(
    request: pytest.FixtureRequest, paths: dict[str, Path], cache: Path
) -> Iterator[tuple[str, str, ServerProcess]]:
    """(model, backend, its server): one server per model and backend, so each model's
    failure is its own."""
    name, backend = request.param
    args = ["--model-id", str(paths[name]), "--served-model-name", name]
    args += ["--dtype", "float32"]  # auto's exact path too: the fp32 bar on any CPU kind
    with start_server([*args, "--backend", backend, "--cache-dir", str(cache)]) as running:
        yield name, backend, running


def _cosines(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    assert got.shape == want.shape
    return (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))


def test_files_are_the_hub_layouts(paths: dict[str, Path]) -> None:
    """What the fixtures mirror: gtr-t5-base's config names the encoder alone, with its
    2.x modules (Dense weights pickled); embeddinggemma-300m's is a bidirectional
    Gemma3TextModel under Transformer, mean Pooling, two Dense, Normalize."""
    gtr = json.loads((paths["gtr"] / "config.json").read_text())
    assert gtr["architectures"] == ["T5EncoderModel"] and gtr["is_encoder_decoder"] is False
    gtr_modules = json.loads((paths["gtr"] / "modules.json").read_text())
    kinds = ("Transformer", "Pooling", "Dense", "Normalize")
    assert [m["type"] for m in gtr_modules] == [f"sentence_transformers.models.{k}" for k in kinds]
    pooling = json.loads((paths["gtr"] / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and "include_prompt" not in pooling
    assert (paths["gtr"] / "2_Dense" / "pytorch_model.bin").exists()
    gemma = json.loads((paths["gemma"] / "config.json").read_text())
    assert gemma["architectures"] == ["Gemma3TextModel"]
    assert gemma["model_type"] == "gemma3_text" and gemma["use_bidirectional_attention"]
    gemma_modules = json.loads((paths["gemma"] / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in gemma_modules] == [
        "Transformer", "Pooling", "Dense", "Dense", "Normalize"
    ]  # fmt: skip


def test_vectors_match_sentence_transformers(
    server: tuple[str, str, ServerProcess], references: dict
) -> None:
    name, backend, running = server
    prompts = [None, "query"] if name == "gemma" else [None]  # its query prompt, by input_type
    with running.client() as client:
        listed = client.get("/v1/models").json()["data"]
        for prompt in prompts:
            body = {"model": name, "input": TEXTS}
            if prompt == "query":
                body["input_type"] = "search_query"
            reply = client.post("/v1/embeddings", json=body)
            assert reply.status_code == 200, reply.text
            got = np.array([row["embedding"] for row in reply.json()["data"]])
            cos = _cosines(got, references[name, prompt])
            assert cos.min() >= MIN_COSINE, (prompt, int(cos.argmin()), cos.min())
    served = "onnx" if backend == "auto" else backend  # auto on a CPU: onnx runs both
    assert [m["backend"] for m in listed] == [served], listed


def test_one_text_alone_is_the_same_vector(
    server: tuple[str, str, ServerProcess], references: dict
) -> None:
    """A batch of one (no padding; the shortest shapes the graphs see)."""
    name, _, running = server
    with running.client() as client:
        for index in (0, 17):
            reply = client.post("/v1/embeddings", json={"model": name, "input": [TEXTS[index]]})
            got = np.array(reply.json()["data"][0]["embedding"])
            want = references[name, None][index]
            assert _cosines(got[None], want[None])[0] >= MIN_COSINE, index


@pytest.mark.parametrize("name", list(BUILDERS))
def test_ct2_refuses_at_start(paths: dict[str, Path], name: str) -> None:
    with pytest.raises(RuntimeError, match="server exited with 2") as failed:
        with start_server(["--model-id", str(paths[name]), "--backend", "ct2"]):
            pass
    last = str(failed.value).strip().splitlines()[-1]
    assert "ct2 runs encoders" in last and "use --backend torch or onnx" in last, last
    assert "Traceback" not in str(failed.value)
