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
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest

from tests.platforms._helpers_runpod_sagemaker import (
    PYTHON,
    REPO,
    FakeRunPodQueue,
    Running,
    child_env,
    free_port,
    load_module,
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


MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"


def runpod_model_cache(root: Path, model_id: str, model_dir: Path, commit: str) -> Path:
    """A hub cache laid out as RunPod mounts an endpoint's cached model: the snapshot's
    files are links (as the hub's blobs are), refs/main names the commit."""
    repo = root / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for item in model_dir.iterdir():
        (snapshot / item.name).symlink_to(item)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return root


@pytest.fixture(scope="module")
def worker(
    minilm_path: Path, tiny_reranker_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """MiniLM named by its hub id and found only in the RunPod model cache (offline: no
    download could stand in), the reranker by path."""
    cache = runpod_model_cache(
        tmp_path_factory.mktemp("runpod-volume") / "hub", MINILM_ID, minilm_path, "0123abcd"
    )
    port = free_port()
    env = child_env(
        {
            "EMBER_MODEL_ID": f"{MINILM_ID};{tiny_reranker_path}",
            "EMBER_RUNPOD_MODEL_CACHE": str(cache),
            "HF_HUB_OFFLINE": "1",
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
    assert "0123abcd" in log  # MiniLM came from the RunPod model cache
    # Starts at 4 jobs and may grow to EMBER_MAX_QUEUE_SIZE 256 // EMBER_MAX_BATCH_SIZE 16.
    assert "concurrency=4 (at most 16)" in log


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


def test_worker_infinity_rerank_fields(worker: Running, reference: dict[str, Any]) -> None:
    """worker-infinity-embedding's `docs` and `return_docs` mean documents and
    return_documents, so its users' jobs run unchanged."""
    job = runsync(worker, {"query": QUERY, "docs": TEXTS, "return_docs": True, "model": "reranker"})
    assert job["status"] == "COMPLETED", job
    for r in job["output"]["results"]:
        assert abs(r["relevance_score"] - reference["rerank"][r["index"]]) < 1e-5
        assert r["document"]["text"] == TEXTS[r["index"]]
    both = runsync(worker, {"query": QUERY, "docs": TEXTS, "documents": TEXTS})
    assert both["status"] == "FAILED" and "not both" in both["error"]


def test_unknown_fields_reach_the_core(worker: Running) -> None:
    """`modality` (and any field the core knows) is passed through, not dropped: a text
    model asked for images says so instead of embedding the URLs as text."""
    job = runsync(
        worker, {"input": ["https://example.com/cat.png"], "modality": "image", "model": "minilm"}
    )
    assert job["status"] == "FAILED", job
    assert "image" in job["error"] and "400" in job["error"]


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


@pytest.mark.parametrize("fixed", ["4", ""])
def test_worker_mode_takes_concurrent_jobs_from_the_queue(
    minilm_path: Path, reference: dict[str, Any], tmp_path: Path, fixed: str
) -> None:
    """Deployed mode: RunPod's JobScaler (asyncio.run, not uvicorn) pulls jobs in batches
    of the concurrency_modifier's value and posts each result, errors as job errors. A
    fixed EMBER_RUNPOD_CONCURRENCY is honoured; unset, the worker starts at 4 jobs, not
    at all its queue could hold (128 with the defaults), so the rest wait in RunPod's
    queue where its autoscaler can see them."""
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
                "RUNPOD_LOG_LEVEL": "INFO",
                **({"EMBER_RUNPOD_CONCURRENCY": fixed} if fixed else {}),
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

    assert queue.batch_sizes[0] == 4, queue.batch_sizes  # the first take
    if fixed:
        assert max(queue.batch_sizes) == 4, queue.batch_sizes  # concurrency_modifier honoured
    else:
        assert max(queue.batch_sizes) <= 4096 // 32, queue.batch_sizes
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


# ------------------------------------------------------------ the handler, in-process
# The handler's own code over a stand-in for the engines (no model needed): what it does
# with an answer too large for RunPod and with a fatal CUDA error, run through RunPod's
# own job runner to see what the platform receives.
handler_module = load_module(HANDLER, "ember_runpod_handler")


class _Loop:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    async def run_async(self, coro: Any) -> Any:
        coro.close()  # the dispatch is not run: the outcome stands in for the engines'
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


def _handler(outcome: Any) -> Any:
    worker = SimpleNamespace(
        settings=SimpleNamespace(max_client_batch_size=2048), loop=_Loop(outcome), engines=[]
    )
    return handler_module.make_handler(worker)


async def _run_job(outcome: Any) -> dict[str, Any]:
    from runpod.serverless.modules.rp_job import run_job

    return await run_job(_handler(outcome), {"id": "j1", "input": {"input": ["x"]}})


async def test_an_answer_over_runpods_output_limit_fails_with_a_message() -> None:
    vectors = np.ones((7000, 384), dtype=np.float32) / 3  # ~20.5 MB as JSON
    body = {"object": "list", "data": [{"embedding": v} for v in vectors]}
    result = await _run_job(body)
    assert "output" not in result, "RunPod would have shown COMPLETED with no output"
    assert "20 MB job-output limit" in result["error"] and "413" in result["error"]
    small = await _run_job({"object": "list", "data": [{"embedding": vectors[0]}]})
    assert "error" not in small and small["output"]["object"] == "list"


@pytest.mark.parametrize(
    ("error", "refresh"),
    [
        (RuntimeError("CUDA error: an illegal memory access was encountered"), True),
        (RuntimeError("CUDA error: device-side assert triggered"), True),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
        (ValueError("something else"), False),
    ],
)
async def test_a_fatal_cuda_error_replaces_the_worker(error: Exception, refresh: bool) -> None:
    result = await _run_job(error)
    assert result["error"].startswith("500 server_error")
    assert bool(result.get("stopPod")) is refresh  # RunPod's SDK: refresh_worker -> stopPod


def test_concurrency_follows_the_engine_backlog() -> None:
    step = handler_module.next_concurrency
    assert step(4, in_flight=4, backlog_batches=0.5, ceiling=128) == 8  # busy, keeping up
    assert step(128, in_flight=128, backlog_batches=0, ceiling=128) == 128  # the ceiling
    assert step(8, in_flight=8, backlog_batches=3, ceiling=128) == 4  # behind: leave jobs
    assert step(1, in_flight=1, backlog_batches=9, ceiling=128) == 1
    assert step(8, in_flight=3, backlog_batches=0, ceiling=128) == 8  # idle slots: keep
    assert step(8, in_flight=8, backlog_batches=1.5, ceiling=128) == 8


def test_cached_snapshot_follows_the_hub_cache_layout(tmp_path: Path, minilm_path: Path) -> None:
    cache = runpod_model_cache(tmp_path, MINILM_ID, minilm_path, "c0ffee")
    found = handler_module.cached_snapshot(cache, MINILM_ID)
    assert found == cache / "models--sentence-transformers--all-MiniLM-L6-v2/snapshots/c0ffee"
    assert handler_module.cached_snapshot(cache, MINILM_ID, "c0ffee") == found
    assert handler_module.cached_snapshot(cache, MINILM_ID, "v2") is None
    assert handler_module.cached_snapshot(cache, "BAAI/bge-small-en-v1.5") is None
    env = {
        "EMBER_MODEL_ID": f"{MINILM_ID};BAAI/bge-small-en-v1.5",
        "EMBER_RUNPOD_MODEL_CACHE": str(cache),
    }
    assert handler_module.model_overrides(env) == {
        "model_id": f"{found};BAAI/bge-small-en-v1.5",
        "served_model_name": f"{MINILM_ID};BAAI/bge-small-en-v1.5",
    }
    assert handler_module.model_overrides({**env, "EMBER_MODEL_ID": "x/y"}) == {}


def test_hub_files_describe_this_worker(worker: Running) -> None:
    """.runpod/hub.json and tests.json as RunPod's Hub reads them: every environment
    variable offered is one the worker reads, and every Hub test job completes here (its
    model id swapped for the one this worker serves)."""
    from ember.config import ServerSettings

    hub = json.loads((HANDLER.parent / ".runpod" / "hub.json").read_text())
    assert hub["type"] == "serverless" and hub["config"]["runsOn"] == "GPU"
    assert hub["config"]["allowedCudaVersions"] == ["13.0"]  # the torch wheel's CUDA
    known = {f"EMBER_{name.upper()}" for name in ServerSettings.model_fields}
    known.add(handler_module.CONCURRENCY_ENV)
    for env in hub["config"]["env"]:
        assert env["key"] in known, env["key"]
        assert {"name", "type", "description", "default"} <= set(env["input"])

    tests = json.loads((HANDLER.parent / ".runpod" / "tests.json").read_text())
    assert tests["tests"] and tests["config"]["gpuCount"] == 1
    for case in tests["tests"]:
        assert case["timeout"] > 0
        job_input = json.loads(
            json.dumps(case["input"]).replace("BAAI/bge-small-en-v1.5", "minilm")
        )
        job = runsync(worker, job_input)
        assert job["status"] == "COMPLETED", (case["name"], job)
