"""RunPod adapter: handler.py under RunPod's own local API server (``--rp_serve_api``).

The worker is started exactly as ``python platforms/runpod/handler.py --rp_serve_api``
runs it, configured only through EMBER_* env vars, and jobs go through ``POST /runsync``,
which wraps the handler the way the RunPod platform does: a returned ``{"error": ...}``
becomes a FAILED job carrying that message, anything else a COMPLETED job whose
``output`` is the handler's return value. Outputs are compared with the core computing
the same inputs in-process.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.platforms._helpers_runpod_sagemaker import (
    PYTHON,
    REPO,
    FakeRunPodQueue,
    Running,
    child_env,
    free_port,
    max_abs_diff,
    running,
)
from tests.support import stop_process

HANDLER = REPO / "platforms" / "runpod" / "handler.py"
NAMES = "minilm;reranker"
TEXTS = ["RunPod workers take jobs from a queue.", "Bananas are yellow."]
QUERY = "How do serverless workers get work?"


@pytest.fixture(scope="module")
def models(minilm_path: Path, tiny_reranker_path: Path) -> str:
    return f"{minilm_path};{tiny_reranker_path}"


@pytest.fixture(scope="module")
def reference(models: str) -> dict[str, Any]:
    """The core's own answers for the same inputs (in-process, same model settings)."""
    from ember.engine import SyncEngineArray

    with SyncEngineArray(model_id=models, served_model_name=NAMES, max_batch_tokens=1024) as ref:
        return {
            "embed": ref.embed(TEXTS, model="minilm").tolist(),
            "rerank": ref.rerank(QUERY, TEXTS, model="reranker"),
        }


@pytest.fixture(scope="module")
def worker(models: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    port = free_port()
    env = child_env(
        {
            "EMBER_MODEL_ID": models,
            "EMBER_SERVED_MODEL_NAME": NAMES,
            "EMBER_DEVICE": "cpu",
            "EMBER_MAX_BATCH_TOKENS": "1024",
            "EMBER_MAX_BATCH_SIZE": "16",
            "EMBER_MAX_QUEUE_SIZE": "256",
            "RUNPOD_LOG_LEVEL": "INFO",
        }
    )
    cmd = [
        PYTHON, str(HANDLER), "--rp_serve_api",
        "--rp_api_port", str(port), "--rp_api_host", "127.0.0.1",
    ]  # fmt: skip
    # RunPod's dev server serves its docs at "/": it answers only after the module-level
    # engine build (load + warm-up) has finished, which is the warmth being tested.
    with running(
        cmd,
        port=port,
        log_path=tmp_path_factory.mktemp("runpod") / "worker.log",
        env=env,
        ready_path="/",
    ) as server:
        yield server


def runsync(worker: Running, job_input: Any) -> dict[str, Any]:
    resp = httpx.post(f"{worker.url}/runsync", json={"input": job_input}, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_worker_is_warm_and_sized_to_the_queue(worker: Running) -> None:
    log = worker.log()
    assert "model minilm ready" in log and "model reranker ready" in log
    # EMBER_MAX_QUEUE_SIZE 256 // EMBER_MAX_BATCH_SIZE 16 jobs per worker.
    assert "concurrency=16" in log


def test_native_embeddings(worker: Running, reference: dict[str, Any]) -> None:
    job = runsync(worker, {"input": TEXTS})
    assert job["status"] == "COMPLETED", job
    out = job["output"]
    assert out["object"] == "list" and out["model"] == "minilm"
    assert [d["index"] for d in out["data"]] == [0, 1]
    for item, ref in zip(out["data"], reference["embed"], strict=True):
        assert max_abs_diff(item["embedding"], ref) < 1e-5


def test_native_rerank(worker: Running, reference: dict[str, Any]) -> None:
    job = runsync(worker, {"query": QUERY, "documents": TEXTS, "return_documents": True})
    assert job["status"] == "COMPLETED", job
    results = job["output"]["results"]
    assert sorted(r["index"] for r in results) == [0, 1]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    for r in results:
        assert abs(r["relevance_score"] - reference["rerank"][r["index"]]) < 1e-5
        assert r["document"]["text"] == TEXTS[r["index"]]


def test_openai_route_returns_the_openai_body(worker: Running, reference: dict[str, Any]) -> None:
    job = runsync(
        worker,
        {
            "openai_route": "/v1/embeddings",
            "openai_input": {"model": "minilm", "input": TEXTS[0], "encoding_format": "float"},
        },
    )
    assert job["status"] == "COMPLETED", job
    out = job["output"]
    assert isinstance(out, dict), "RunPod's OpenAI passthrough needs the body, not a list"
    assert out["object"] == "list" and len(out["data"]) == 1
    assert max_abs_diff(out["data"][0]["embedding"], reference["embed"][0]) < 1e-5
    assert out["usage"]["prompt_tokens"] > 0

    models = runsync(worker, {"openai_route": "/v1/models"})
    assert models["status"] == "COMPLETED", models
    assert [m["id"] for m in models["output"]["data"]] == NAMES.split(";")


@pytest.mark.parametrize(
    ("job_input", "fragment"),
    [
        ({"input": []}, "422 invalid_request_error"),
        ({"input": ["x"], "model": "nope"}, "model 'nope' is not served"),
        ({"openai_route": "/v1/chat/completions", "openai_input": {}}, "no route"),
        ({"openai_route": 7}, "openai_route"),
        ({"prompt": "x"}, "cannot tell what to do"),
    ],
)
def test_bad_input_fails_the_job_with_the_message(
    worker: Running, job_input: dict[str, Any], fragment: str
) -> None:
    job = runsync(worker, job_input)
    assert job["status"] == "FAILED", job
    assert fragment in job["error"], json.dumps(job)
    assert "output" not in job


def test_shipped_test_input_completes(worker: Running) -> None:
    """platforms/runpod/test_input.json is what `python handler.py` runs locally."""
    shipped = json.loads((HANDLER.parent / "test_input.json").read_text())
    job = runsync(worker, shipped["input"])
    assert job["status"] == "COMPLETED", job
    assert len(job["output"]["data"]) == len(shipped["input"]["input"])


def test_worker_mode_takes_concurrent_jobs_from_the_queue(
    minilm_path: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    """Deployed mode: RunPod's JobScaler (asyncio.run, not uvicorn) pulls jobs in batches
    of the concurrency_modifier's value and posts each result, errors as job errors."""
    jobs: list[dict[str, Any]] = [
        {"id": f"job-{i}", "input": {"input": [TEXTS[i % 2]]}} for i in range(10)
    ]
    jobs.append({"id": "job-bad", "input": {"input": [], "model": "minilm"}})
    with FakeRunPodQueue(jobs) as queue:
        env = child_env(
            {
                **queue.env(),
                "EMBER_MODEL_ID": str(minilm_path),
                "EMBER_SERVED_MODEL_NAME": "minilm",
                "EMBER_DEVICE": "cpu",
                "EMBER_MAX_BATCH_TOKENS": "1024",
                "EMBER_RUNPOD_CONCURRENCY": "4",
                "RUNPOD_LOG_LEVEL": "INFO",
            }
        )
        log_path = tmp_path / "worker.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [PYTHON, str(HANDLER)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            finished = queue.done.wait(timeout=240)
        finally:
            stop_process(proc)
        text = log_path.read_text(errors="replace")
        assert finished, f"results {sorted(queue.results)} of {len(jobs)}:\n{text[-4000:]}"

    assert max(queue.batch_sizes) == 4, queue.batch_sizes  # concurrency_modifier honoured
    for i in range(10):
        out = queue.results[f"job-{i}"]["output"]
        assert out["object"] == "list" and out["model"] == "minilm"
        assert max_abs_diff(out["data"][0]["embedding"], reference["embed"][i % 2]) < 1e-5
    bad = queue.results["job-bad"]
    assert "output" not in bad and bad["error"].startswith("422 invalid_request_error"), bad


def test_bad_concurrency_setting_stops_the_worker_before_loading(tmp_path: Path) -> None:
    proc = subprocess.run(
        [PYTHON, str(HANDLER)],
        cwd=tmp_path,
        env=child_env({"EMBER_RUNPOD_CONCURRENCY": "0"}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "EMBER_RUNPOD_CONCURRENCY must be a positive integer, got '0'" in proc.stderr
    assert "ready:" not in proc.stderr  # no model was loaded
