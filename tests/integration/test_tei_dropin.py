"""`ember tei` started as TEI's README starts text-embeddings-router, once with its flags
and once with its variables, answering Hugging Face's `InferenceClient` and TEI's routes
with the limits the deployment set."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from huggingface_hub import InferenceClient, constants

from tests.support import ServerProcess, child_env, free_port, spawn, stop_process, wait_ready

KEY = "tei-secret"
TEXT = "What is Deep Learning?"


def _flags(model: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """text-embeddings-router's flags, as its README and `--help` write them."""
    return [
        "--model-id", str(model), "--hostname", "127.0.0.1", "-p", str(port),
        "--dtype", "float32", "--pooling", "mean", "--max-batch-tokens", "4096",
        "--max-batch-requests", "16", "--max-client-batch-size", "8", "--payload-limit",
        "20000", "--api-key", KEY, "--json-output", "--tokenization-workers", "2",
        "--served-model-name", "minilm-tei",
    ], {}  # fmt: skip


def _variables(model: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The same deployment through the router's variables (`docker run -e ...`)."""
    return [], {
        "MODEL_ID": str(model),
        "HOSTNAME": "127.0.0.1",
        "PORT": str(port),
        "DTYPE": "float32",
        "POOLING": "mean",
        "MAX_BATCH_TOKENS": "4096",
        "MAX_BATCH_REQUESTS": "16",
        "MAX_CLIENT_BATCH_SIZE": "8",
        "PAYLOAD_LIMIT": "20000",
        "API_KEY": KEY,
        "JSON_OUTPUT": "true",
        "TOKENIZATION_WORKERS": "2",
        "SERVED_MODEL_NAME": "minilm-tei",
    }


@pytest.fixture(scope="module", params=[_flags, _variables], ids=["flags", "variables"])
def tei(
    request: pytest.FixtureRequest, minilm_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    port = free_port()
    args, env = request.param(minilm_path, port)
    env["EMBER_CACHE_DIR"] = os.environ["EMBER_CACHE_DIR"]  # the session's graphs (conftest)
    log = tmp_path_factory.mktemp("tei") / "ember-tei.log"
    process = spawn(
        [sys.executable, "-m", "ember", "tei", *args],
        child_env(env, drop_prefixes=("EMBER_", "PORT", "HOSTNAME")),
        log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log)
        yield ServerProcess(url, process, log, KEY, {"Authorization": f"Bearer {KEY}"})
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def reference(minilm_path: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_path), device="cpu").encode([TEXT])


def test_the_client_gets_the_models_vectors(
    tei: ServerProcess, reference: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # a loopback URL, not the hub
    client = InferenceClient(model=tei.url, token=KEY, timeout=60)
    got = client.feature_extraction(TEXT, normalize=False)
    assert got.shape == (1, 384)
    cosine = float(got[0] @ reference[0] / np.linalg.norm(got[0]) / np.linalg.norm(reference[0]))
    assert cosine >= 0.9999


def test_the_deployments_limits_hold(tei: ServerProcess) -> None:
    with tei.client() as http:
        info = http.get("/info").json()
        assert info["max_client_batch_size"] == 8 and info["model_id"] == "minilm-tei"
        assert http.post("/embed", json={"inputs": ["x"] * 9}).status_code == 413
        assert http.post("/embed", json={"inputs": "x" * 30000}).status_code == 413
        assert http.post("/embed", json={"inputs": ["a", "b"]}).status_code == 200
    assert httpx.post(f"{tei.url}/embed", json={"inputs": "x"}, timeout=30).status_code == 401


def test_logs_are_json_and_name_what_ember_does_otherwise(tei: ServerProcess) -> None:
    lines = [line for line in tei.log().splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in lines]
    assert records, tei.log()[-2000:]
    warned = [r["message"] for r in records if r.get("level", "").upper() == "WARNING"]
    assert any("tokenis" in message.lower() for message in warned), warned
    assert not any("text-embeddings-router's variable" in m for m in warned)
