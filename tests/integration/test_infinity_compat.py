"""Switching from Infinity changes the image or one import line, nothing more.

Real servers: `ember serve` started from an Infinity v2 command line, from INFINITY_*
variables alone, and as a user runs it; Infinity's generated client (``infinity_client``,
with its own constructors and defaults) against them; ``--preload-only``; and a program
written for Infinity's Python API run with only its import changed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from infinity_client import AuthenticatedClient, Client
from infinity_client.api.default import classify, embeddings, health, models, rerank
from infinity_client.models import (
    ClassifyInput,
    ClassifyResult,
    OpenAIEmbeddingInputText,
    OpenAIEmbeddingResult,
    OpenAIModelInfo,
    RerankInput,
    ReRankResult,
)

from ember.heads.quantize import encode_embeddings
from tests.support import (
    REPO,
    ServerProcess,
    child_env,
    free_port,
    spawn,
    stop_process,
    wait_ready,
)

KEY = "infinity-key"
TEXTS = ["The cat sat on the mat.", "Embeddings map text to vectors.", "🙂 unicode ü"]
QUERY = "Where do cats sit?"
DOCS = ["Cats like to sit on mats.", "The stock market fell.", "A mat is on the floor."]


@contextmanager
def _serve(
    argv: list[str], env: dict[str, str], tmp: Path, url: str, key: str | None
) -> Iterator[ServerProcess]:
    """`python -m ember ARGV` with exactly ``env`` as its settings (no EMBER_* or
    INFINITY_* inherited; converted artifacts under ``tmp``)."""
    log_path = tmp / "server.log"
    extra = {"XDG_CACHE_HOME": str(tmp / "cache"), **env}
    process = spawn(
        [sys.executable, "-m", "ember", *argv],
        child_env(extra, drop_prefixes=("EMBER_", "INFINITY_")),
        log_path,
    )
    try:
        wait_ready(url, process, log_path)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        yield ServerProcess(url, process, log_path, key, headers)
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def v2_server(
    tmp_path_factory: pytest.TempPathFactory,
    minilm_path: Path,
    tiny_reranker_path: Path,
    tiny_classifier_path: Path,
) -> Iterator[ServerProcess]:
    """An Infinity deployment's command line, unchanged but for the program's name."""
    port = free_port()
    argv = ["v2", "--host", "127.0.0.1", "--port", str(port)]
    for path, name in (
        (minilm_path, "minilm"),
        (tiny_reranker_path, "reranker"),
        (tiny_classifier_path, "classifier"),
    ):
        argv += ["--model-id", str(path), "--served-model-name", name]
    argv += [
        "--engine",
        "torch",
        "--batch-size",
        "16",
        "--url-prefix",
        "/v1",
        "--api-key",
        KEY,
        "--no-model-warmup",
        "--bettertransformer",
        "--lengths-via-tokenize",
        "--log-level",
        "info",
    ]
    url = f"http://127.0.0.1:{port}"
    with _serve(argv, {}, tmp_path_factory.mktemp("v2"), url, KEY) as proc:
        yield proc


@pytest.fixture(scope="module")
def plain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The packaged model, no key: the most ordinary deployment."""
    port = free_port()
    argv = ["serve", "--host", "127.0.0.1", "--port", str(port), "--backend", "torch"]
    url = f"http://127.0.0.1:{port}"
    with _serve(argv, {}, tmp_path_factory.mktemp("plain"), url, None) as proc:
        yield proc


# ---- an Infinity v2 command line ---------------------------------------------------------


def test_v2_command_line_serves_its_models_prefix_and_key(v2_server: ServerProcess) -> None:
    with v2_server.client() as client:
        cards = client.get("/v1/models").json()["data"]
        assert [c["id"] for c in cards] == ["minilm", "reranker", "classifier"]
        assert {c["backend"] for c in cards} == {"torch"}
        assert [c["stats"]["batch_size"] for c in cards] == [16, 16, 16]
        for path in ("/v1/embeddings", "/embeddings"):  # the prefix, and the root too
            body = {"model": "minilm", "input": ["hello"]}
            assert len(client.post(path, json=body).json()["data"][0]["embedding"]) == 384
        prefixed = client.post("/v1/classify", json={"model": "classifier", "input": ["x"]})
        assert prefixed.json()["object"] == "classify"
    for path in ("/v1/embeddings", "/v1/models", "/embeddings"):
        refused = httpx.request(
            "POST" if "emb" in path else "GET",
            v2_server.url + path,
            json={"model": "minilm", "input": ["hello"]},
            timeout=30,
        )
        assert refused.status_code == 401, path
    log = v2_server.log()
    for flag in ("--model-warmup=false", "--bettertransformer=true"):
        assert log.count(flag) == 1, log  # one warning each, saying what Ember does
    assert "--lengths-via-tokenize" not in log  # Ember does that already: nothing to say


def test_v2_url_prefix_keeps_cohere_v1_embed(v2_server: ServerProcess) -> None:
    """/v1/embed is a route of its own (Cohere's), not /embed under the prefix."""
    with v2_server.client() as client:
        answer = client.post("/v1/embed", json={"model": "minilm", "texts": ["hi"]})
    assert answer.status_code == 200 and answer.json()["response_type"] == "embeddings_floats"


# ---- Infinity's generated client ---------------------------------------------------------


def test_client_defaults_against_a_plain_server(plain_server: ServerProcess) -> None:
    """The issue's first call: Client(base_url) and the generated body as generated (it
    sends dimensions 0 and modality text)."""
    client = Client(base_url=plain_server.url)
    body = OpenAIEmbeddingInputText(input_=["hello", "world"])
    assert body.to_dict()["dimensions"] == 0 and body.to_dict()["modality"] == "text"
    response = embeddings.sync_detailed(client=client, body=body)
    assert response.status_code == 200, response.content
    result = response.parsed
    assert isinstance(result, OpenAIEmbeddingResult)
    assert [len(item.embedding) for item in result.data] == [384, 384]
    assert result.usage.total_tokens > 0
    own = httpx.post(
        plain_server.url + "/v1/embeddings", json={"input": ["hello", "world"]}, timeout=30
    ).json()
    got = np.array([item.embedding for item in result.data])
    want = np.array([item["embedding"] for item in own["data"]])
    np.testing.assert_allclose(got, want, atol=1e-6)
    listed = models.sync(client=client)
    assert isinstance(listed, OpenAIModelInfo)
    assert listed.data[0].capabilities == ["embed"]
    assert listed.data[0].stats.additional_properties["batch_size"] == 32
    alive = health.sync(client=client)
    assert alive is not None and alive["unix"] > 0


@pytest.mark.parametrize("base", ["", "/v1"])
def test_client_every_route_with_key_at_root_and_prefix(
    v2_server: ServerProcess, base: str
) -> None:
    client = AuthenticatedClient(base_url=v2_server.url + base, token=KEY)
    with v2_server.client() as own:
        vectors = embeddings.sync(
            client=client, body=OpenAIEmbeddingInputText(input_=TEXTS, model="minilm")
        )
        assert isinstance(vectors, OpenAIEmbeddingResult)
        want = own.post("/embeddings", json={"model": "minilm", "input": TEXTS}).json()
        np.testing.assert_allclose(
            [v.embedding for v in vectors.data],
            [v["embedding"] for v in want["data"]],
            atol=1e-6,
        )
        short = embeddings.sync(
            client=client,
            body=OpenAIEmbeddingInputText(input_=TEXTS[0], model="minilm", dimensions=64),
        )
        assert isinstance(short, OpenAIEmbeddingResult) and len(short.data[0].embedding) == 64

        ranked = rerank.sync(
            client=client,
            body=RerankInput(
                query=QUERY, documents=DOCS, model="reranker", top_n=2, return_documents=True
            ),
        )
        assert isinstance(ranked, ReRankResult)
        assert ranked.object_ == "rerank" and ranked.id and ranked.created > 0
        body = {"model": "reranker", "query": QUERY, "documents": DOCS, "top_n": 2}
        want = own.post("/rerank", json=body).json()["results"]
        assert [(r.index, r.relevance_score) for r in ranked.results] == [
            (r["index"], r["relevance_score"]) for r in want
        ]
        # Infinity's answer on /rerank: the document itself. Under --url-prefix /v1,
        # /v1/rerank is Cohere's route and Cohere's shape wins there (README).
        for r in ranked.results:
            assert r.document == (DOCS[r.index] if base == "" else {"text": DOCS[r.index]})

        labels = classify.sync(client=client, body=ClassifyInput(input_=TEXTS, model="classifier"))
        assert isinstance(labels, ClassifyResult) and labels.object_ == "classify"
        body = {"model": "classifier", "input": TEXTS}
        want = own.post("/classify", json=body).json()["data"]
        assert [[(c.label, c.score) for c in row] for row in labels.data] == [
            [(c["label"], c["score"]) for c in row] for row in want
        ]

    listed = models.sync(client=client)
    assert isinstance(listed, OpenAIModelInfo)
    assert [(m.id, m.capabilities) for m in listed.data] == [
        ("minilm", ["embed"]),
        ("reranker", ["rerank"]),
        ("classifier", ["classify"]),
    ]
    assert health.sync_detailed(client=client).status_code == 200
    # A wrong key is refused as Infinity refuses it.
    wrong = AuthenticatedClient(base_url=v2_server.url + base, token="nope")
    assert models.sync_detailed(client=wrong).status_code == 401


# ---- INFINITY_* variables alone ----------------------------------------------------------


def test_infinity_variables_alone(
    tmp_path: Path, minilm_path: Path, tiny_reranker_path: Path
) -> None:
    port = free_port()
    env = {
        "INFINITY_MODEL_ID": f"{minilm_path};{tiny_reranker_path};",
        "INFINITY_SERVED_MODEL_NAME": "minilm;tiny-reranker",
        "INFINITY_ENGINE": "torch;optimum",
        "INFINITY_BATCH_SIZE": "8;4",
        "INFINITY_EMBEDDING_DTYPE": "int8;float32",
        "INFINITY_HOST": "127.0.0.1",
        "INFINITY_PORT": str(port),
        "INFINITY_URL_PREFIX": "/infinity",
        "INFINITY_API_KEY": KEY,
        "INFINITY_BETTERTRANSFORMER": "false",
        "INFINITY_ANONYMOUS_USAGE_STATS": "false",
        "INFINITY_VECTOR_DISK_CACHE": "true",
    }
    url = f"http://127.0.0.1:{port}"
    with _serve(["serve"], env, tmp_path, url, KEY) as proc, proc.client() as client:
        cards = client.get("/infinity/models").json()["data"]
        assert [(c["id"], c["backend"], c["stats"]["batch_size"]) for c in cards] == [
            ("minilm", "torch", 8),
            ("tiny-reranker", "onnx", 4),
        ]
        body = {"model": "tiny-reranker", "query": QUERY, "documents": DOCS}
        results = client.post("/infinity/rerank", json=body).json()["results"]
        assert len(results) == 3 and [r["document"] for r in results] == [None] * 3
        body = {**body, "return_documents": True, "top_n": 2}
        results = client.post("/infinity/rerank", json=body).json()["results"]
        assert [r["document"] for r in results] == [DOCS[r["index"]] for r in results]
        assert len(results) == 2
        body = {"model": "minilm", "input": TEXTS, "dimensions": 0, "modality": "text"}
        vectors = [
            v["embedding"] for v in client.post("/infinity/embeddings", json=body).json()["data"]
        ]
        cohere = {"model": "minilm", "texts": TEXTS, "embedding_types": ["int8"]}
        assert vectors == client.post("/v2/embed", json=cohere).json()["embeddings"]["int8"]
        refused = client.post("/infinity/embeddings", json={**body, "encoding_format": "base64"})
        assert refused.status_code == 400 and "int8" in refused.json()["error"]["message"]
        assert httpx.get(url + "/infinity/models", timeout=30).status_code == 401
        log = proc.log()
    assert log.count("INFINITY_VECTOR_DISK_CACHE=true") == 1
    assert "INFINITY_BETTERTRANSFORMER" not in log and "ANONYMOUS" not in log


# ---- --preload-only ----------------------------------------------------------------------


def test_preload_only_converts_then_exits(tmp_path: Path, tiny_reranker_path: Path) -> None:
    cache = tmp_path / "cache"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ember",
            "v2",
            "--model-id",
            str(tiny_reranker_path),
            "--engine",
            "optimum",
            "--preload-only",
            "--port",
            str(free_port()),
        ],
        env=child_env({"XDG_CACHE_HOME": str(cache)}, drop_prefixes=("EMBER_", "INFINITY_")),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "preloaded" in result.stdout + result.stderr
    assert list((cache / "ember").rglob("*.onnx")), "the ONNX artifact is left in the cache"


# ---- Infinity's Python API, one import changed -------------------------------------------

PROGRAM = """
import asyncio, json, sys
from infinity_emb import AsyncEngineArray, EngineArgs

async def main(embedder, reranker, classifier):
    array = AsyncEngineArray.from_args([
        EngineArgs(model_name_or_path=embedder, served_model_name="embed", engine="torch"),
        EngineArgs(model_name_or_path=reranker, served_model_name="rerank", engine="torch"),
        EngineArgs(model_name_or_path=classifier, served_model_name="classify"),
        EngineArgs(model_name_or_path=embedder, served_model_name="int8", embedding_dtype="int8"),
    ])
    await array.astart()
    vectors, embed_usage = await array.embed(model="embed", sentences=TEXTS)
    ranked, _ = await array.rerank(model="rerank", query=QUERY, docs=DOCS, top_n=2)
    labels, _ = await array.classify(model="classify", sentences=TEXTS)
    quantized, _ = await array.embed(model="int8", sentences=TEXTS)
    async with array["embed"]:  # already started: a no-op, as in Infinity
        short, _ = await array["embed"].embed(TEXTS, matryoshka_dim=64)
    await array.astop()
    print(json.dumps({
        "vectors": [v.tolist() for v in vectors],
        "short": [v.tolist() for v in short],
        "usage": embed_usage,
        "ranked": [[r.index, r.relevance_score, r.document] for r in ranked],
        "labels": labels,
        "int8": [[str(v.dtype), *v.tolist()] for v in quantized],
    }))

asyncio.run(main(*sys.argv[1:]))
"""


def test_python_api_program_with_one_changed_import(
    tmp_path: Path, minilm_path: Path, tiny_reranker_path: Path, tiny_classifier_path: Path
) -> None:
    ported = PROGRAM.replace("from infinity_emb import", "from ember.infinity import")
    changed = [a for a, b in zip(PROGRAM.splitlines(), ported.splitlines(), strict=True) if a != b]
    assert changed == ["from infinity_emb import AsyncEngineArray, EngineArgs"]
    script = tmp_path / "program.py"
    constants = f"TEXTS = {TEXTS!r}\nQUERY = {QUERY!r}\nDOCS = {DOCS!r}\n"
    script.write_text(ported.replace("async def main", constants + "\nasync def main", 1))
    paths = [str(minilm_path), str(tiny_reranker_path), str(tiny_classifier_path)]
    result = subprocess.run(
        [sys.executable, str(script), *paths],
        env=child_env({}, drop_prefixes=("EMBER_", "INFINITY_")),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])

    from ember.engine import SyncEngineArray

    with SyncEngineArray(
        model_id=paths,
        served_model_name=["embed", "rerank", "classify"],
        backend="torch",
        trust_remote_code=True,  # Infinity's EngineArgs default
    ) as ember:
        vectors = ember.embed(TEXTS, model="embed")
        short = ember.embed(TEXTS, model="embed", dimensions=64)
        scores = ember.rerank(QUERY, DOCS, model="rerank")
        labels = ember.classify(TEXTS, model="classify")
    np.testing.assert_allclose(out["vectors"], vectors, atol=1e-6)
    np.testing.assert_allclose(out["short"], short, atol=1e-6)
    assert out["usage"] > len(TEXTS)  # tokens, not texts
    int8 = encode_embeddings(vectors, ["int8"])["int8"]
    assert out["int8"] == [["int8", *row.tolist()] for row in int8]
    best = np.argsort(-np.array(scores), kind="stable")[:2]
    assert [r[0] for r in out["ranked"]] == best.tolist()
    np.testing.assert_allclose([r[1] for r in out["ranked"]], np.array(scores)[best], atol=1e-6)
    assert [r[2] for r in out["ranked"]] == [DOCS[i] for i in best]
    assert [[c["label"] for c in row] for row in out["labels"]] == [
        [c["label"] for c in row] for row in labels
    ]
    np.testing.assert_allclose(
        [[c["score"] for c in row] for row in out["labels"]],
        [[c["score"] for c in row] for row in labels],
        atol=1e-6,
    )


def test_engine_refuses_calls_before_astart(minilm_path: Path) -> None:
    from ember.infinity import AsyncEmbeddingEngine, EngineArgs

    engine = AsyncEmbeddingEngine.from_args(EngineArgs(model_name_or_path=str(minilm_path)))
    assert engine.capabilities == {"embed"}  # known from the files, before loading
    old_style = AsyncEmbeddingEngine(model_name_or_path=str(minilm_path), batch_size=8)
    assert old_style.engine_args == EngineArgs(model_name_or_path=str(minilm_path), batch_size=8)
    assert engine.engine_args.served_model_name == "/".join(str(minilm_path).split("/")[-2:])
    with pytest.raises(ValueError, match="didn't start"):
        asyncio.run(engine.embed(["x"]))


# ---- images and audio ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def media_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.fixtures.media_models import build_tiny_clap, build_tiny_clip

    root = tmp_path_factory.mktemp("infinity-media")
    return {"clip": build_tiny_clip(root / "clip"), "clap": build_tiny_clap(root / "clap")}


@pytest.fixture(scope="module")
def media_server(media_paths: dict[str, Path]) -> Iterator[ServerProcess]:
    from tests.support import start_server

    models = f"{media_paths['clip']};{media_paths['clap']}"
    with start_server(["--model-id", models, "--served-model-name", "clip;clap"]) as proc:
        yield proc


def _media_items() -> tuple[list[str], list[str]]:
    from tests.fixtures.media_samples import (
        CLAP_RATE,
        audio_data_uri,
        gradient_image,
        image_data_uri,
        shapes_image,
        sine,
    )

    images = [image_data_uri(gradient_image(64, 48)), image_data_uri(shapes_image(40, 40))]
    clips = [
        audio_data_uri(sine(440.0, 1.0), CLAP_RATE),
        audio_data_uri(sine(880.0, 0.5), CLAP_RATE),
    ]
    return images, clips


def _own(server: ServerProcess, model: str, items: list[str], modality: str) -> np.ndarray:
    body = {"model": model, "input": items, "modality": modality}
    answer = httpx.post(server.url + "/v1/embeddings", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return np.array([item["embedding"] for item in answer.json()["data"]])


def test_client_images_and_audio(media_server: ServerProcess) -> None:
    """Infinity's generated client for every media call: /embeddings with modality image
    and audio (its own body classes), and the legacy /embeddings_image, /embeddings_audio."""
    from infinity_client.api.default import embeddings_audio, embeddings_image
    from infinity_client.models import (
        AudioEmbeddingInput,
        ImageEmbeddingInput,
        OpenAIEmbeddingInputAudio,
        OpenAIEmbeddingInputImage,
    )

    images, clips = _media_items()
    client = Client(base_url=media_server.url)
    cases = [
        (embeddings.sync, OpenAIEmbeddingInputImage(input_=images, model="clip"), "clip", images),
        (embeddings.sync, OpenAIEmbeddingInputAudio(input_=clips, model="clap"), "clap", clips),
        (embeddings_image.sync, ImageEmbeddingInput(input_=images, model="clip"), "clip", images),
        (embeddings_audio.sync, AudioEmbeddingInput(input_=clips, model="clap"), "clap", clips),
    ]
    for call, body, model, items in cases:
        result = call(client=client, body=body)
        assert isinstance(result, OpenAIEmbeddingResult), (call, body)
        modality = "image" if model == "clip" else "audio"
        np.testing.assert_allclose(
            [v.embedding for v in result.data],
            _own(media_server, model, items, modality),
            atol=1e-6,
        )
    text = embeddings.sync(
        client=client, body=OpenAIEmbeddingInputText(input_="a cat", model="clip")
    )
    assert isinstance(text, OpenAIEmbeddingResult)
    np.testing.assert_allclose(
        text.data[0].embedding, _own(media_server, "clip", ["a cat"], "text")[0], atol=1e-6
    )
    listed = models.sync(client=client)
    assert isinstance(listed, OpenAIModelInfo)
    assert [set(m.capabilities) for m in listed.data] == [
        {"embed", "image_embed"},
        {"embed", "audio_embed"},
    ]


def test_python_api_images_and_audio(
    media_server: ServerProcess, media_paths: dict[str, Path]
) -> None:
    """image_embed and audio_embed through ember.infinity, equal to the server's answers;
    a PIL image is taken as Infinity takes it."""
    from ember.infinity import AsyncEngineArray, EngineArgs
    from tests.fixtures.media_samples import decode_image

    images, clips = _media_items()
    want_images = _own(media_server, "clip", images, "image")
    want_clips = _own(media_server, "clap", clips, "audio")
    pil = decode_image(_data_uri_bytes(images[0]))

    async def run() -> tuple[list, list, list, int]:
        array = AsyncEngineArray.from_args(
            [
                EngineArgs(model_name_or_path=str(media_paths["clip"]), served_model_name="clip"),
                EngineArgs(model_name_or_path=str(media_paths["clap"]), served_model_name="clap"),
            ]
        )
        await array.astart()
        try:
            got_images, _ = await array.image_embed(model="clip", images=images)
            got_pil, _ = await array.image_embed(model="clip", images=[pil])
            got_clips, usage = await array.audio_embed(model="clap", audios=clips)
        finally:
            await array.astop()
        return got_images, got_pil, got_clips, usage

    got_images, got_pil, got_clips, usage = asyncio.run(run())
    np.testing.assert_allclose(got_images, want_images, atol=1e-6)
    np.testing.assert_allclose(got_pil[0], want_images[0], atol=1e-5)
    np.testing.assert_allclose(got_clips, want_clips, atol=1e-6)
    assert usage > 0


def _data_uri_bytes(uri: str) -> bytes:
    import base64

    return base64.b64decode(uri.split(",", 1)[1])
