"""SageMaker Batch Transform: the container side (`serve.py serve` answering real JSON Lines
on /invocations, as Batch Transform sends them with SplitType=Line and
BatchStrategy=MultiRecord) and the transform job that `deploy.py batch` defines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.platforms._helpers_runpod_sagemaker import (
    PYTHON,
    REPO,
    Running,
    child_env,
    free_port,
    running,
)

SERVE = REPO / "platforms" / "sagemaker" / "serve.py"
NAMES = "minilm;reranker"
QUEUE = 128  # the container's queue limit: a mini-batch far larger must still pass
TEXTS = [f"line {i}: " + "batch transform splits files by line " * (i % 4) for i in range(600)]
QUERY = "Which lines are split?"


@pytest.fixture(scope="module")
def models(minilm_path: Path, tiny_reranker_path: Path) -> str:
    return f"{minilm_path};{tiny_reranker_path}"


@pytest.fixture(scope="module")
def reference(models: str) -> dict[str, Any]:
    from ember.engine import SyncEngineArray

    with SyncEngineArray(model_id=models, served_model_name=NAMES, backend="torch") as ref:
        return {
            "embed": ref.embed(TEXTS, model="minilm"),
            "rerank": ref.rerank(QUERY, TEXTS[:3], model="reranker"),
        }


@pytest.fixture(scope="module")
def endpoint(models: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    port = free_port()
    env = child_env(
        {
            "SAGEMAKER_BIND_TO_PORT": str(port),
            "EMBER_HOST": "127.0.0.1",
            "EMBER_MODEL_ID": models,
            "EMBER_SERVED_MODEL_NAME": NAMES,
            "EMBER_BACKEND": "torch",
            "EMBER_DEVICE": "cpu",
            "EMBER_MAX_QUEUE_SIZE": str(QUEUE),
        },
        drop_prefixes=("EMBER_",),
    )
    with running(
        [PYTHON, str(SERVE), "serve"],
        port=port,
        log_path=tmp_path_factory.mktemp("sagemaker-batch") / "serve.log",
        env=env,
        ready_path="/ping",
    ) as server:
        yield server


def _post_lines(endpoint: Running, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{endpoint.url}/invocations",
        content=body,
        headers={"Content-Type": "application/jsonlines", "Accept": "application/jsonlines"},
        timeout=120,
    )


def test_one_output_line_per_input_line_in_order(
    endpoint: Running, reference: dict[str, Any]
) -> None:
    """600 records (strings and objects with ids) in one mini-batch behind a queue of 128:
    each answered on its own line, in order, equal to the engine's vectors."""
    lines = [
        json.dumps({"id": f"doc-{i}", "text": t}) if i % 3 else json.dumps(t)
        for i, t in enumerate(TEXTS)
    ]
    resp = _post_lines(endpoint, ("\n".join(lines) + "\n").encode())
    assert resp.status_code == 200, resp.text[:2000]
    assert resp.headers["content-type"] == "application/jsonlines"
    assert resp.text.endswith("\n")
    out = [json.loads(line) for line in resp.text.splitlines()]
    assert len(out) == len(TEXTS)
    assert [o.get("id") for o in out] == [f"doc-{i}" if i % 3 else None for i in range(600)]
    got = np.asarray([o["embedding"] for o in out], dtype=np.float32)
    assert np.abs(got - reference["embed"]).max() < 1e-5


def test_request_body_lines_are_answered_as_invocations(
    endpoint: Running, reference: dict[str, Any]
) -> None:
    """A line may be a whole body (rerank, OpenAI embeddings): its answer is the line."""
    lines = [
        json.dumps({"query": QUERY, "documents": TEXTS[:3], "model": "reranker"}),
        json.dumps(TEXTS[0]),
        json.dumps({"input": TEXTS[1], "model": "minilm"}),
    ]
    resp = _post_lines(endpoint, "\n".join(lines).encode())  # no final newline: still 3
    assert resp.status_code == 200, resp.text
    rerank, plain, openai = (json.loads(line) for line in resp.text.splitlines())
    scores = {r["index"]: r["relevance_score"] for r in rerank["results"]}
    assert all(abs(scores[i] - reference["rerank"][i]) < 1e-5 for i in range(3))
    assert np.abs(np.asarray(plain["embedding"]) - reference["embed"][0]).max() < 1e-5
    assert openai["object"] == "list"
    assert np.abs(np.asarray(openai["data"][0]["embedding"]) - reference["embed"][1]).max() < 1e-5


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'"fine"\n{broken\n', "line 2 of the JSON Lines body is not JSON"),
        (b'"fine"\n[1, 2]\n', "record 2 is neither one input"),
        (b'{"text": 3}\n', "record 1 is neither one input"),
    ],
)
def test_a_bad_line_fails_the_mini_batch_naming_it(
    endpoint: Running, body: bytes, fragment: str
) -> None:
    resp = _post_lines(endpoint, body)
    assert resp.status_code == 400, resp.text
    assert fragment in resp.json()["error"]["message"]


def test_other_content_types_still_415_and_name_both(endpoint: Running) -> None:
    resp = httpx.post(
        f"{endpoint.url}/invocations",
        content=b"a,b\n",
        headers={"Content-Type": "text/csv"},
        timeout=10,
    )
    assert resp.status_code == 415
    message = resp.json()["error"]["message"]
    assert "application/json" in message and "application/jsonlines" in message
