"""OpenAI batch files through `ember embed`: killed with SIGKILL mid-run and run again, the
results hold one line per input line, every custom_id once, each body what the HTTP route
answers for the same body; a bad line gets its own error object and the job goes on."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ember.config import settings_from_env
from ember.engine import EngineArray
from ember.errors import ConfigError
from ember.jobs.batch import run_batch_job
from tests.support import REPO, ServerProcess, child_env

LINES = 120
COMMIT = 5
VOLATILE = {"id", "created"}  # differ between any two answers
WORDS = "batch files carry one request per line for offline embedding jobs".split()


def _request(custom_id: str, url: str, body: dict[str, Any]) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _good_lines() -> list[str]:
    rng = np.random.default_rng(3)
    lines = []
    for i in range(LINES):
        texts = [f"{i} " + " ".join(rng.choice(WORDS, size=int(rng.integers(3, 30)))) for _ in "ab"]
        if i % 10 == 9:  # vLLM's score on an embedding model: the cosine
            body = {"model": "minilm", "text_1": texts[0], "text_2": texts}
            lines.append(_request(f"req-{i}", "/score", body))
        else:
            lines.append(
                _request(f"req-{i}", "/v1/embeddings", {"model": "minilm", "input": texts})
            )
    return lines


# (the line, the status its result must have, a fragment of its message)
NO_ID = json.dumps({"method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}})
RERANK = {"model": "minilm", "query": "q", "documents": ["d"]}
BAD = [
    ("this is not JSON", 400, "line 3 is not JSON"),
    (NO_ID, 400, "no custom_id"),
    (_request("bad-url", "/v1/nothing", {"input": "x"}), 404, "no model route '/v1/nothing'"),
    (_request("bad-body", "/v1/embeddings", {"model": "minilm", "input": []}), 422, "input"),
    (_request("bad-task", "/v1/rerank", RERANK), 400, "does not rerank"),
    (_request("req-0", "/v1/embeddings", {"model": "minilm", "input": "again"}), 400, "repeats"),
    (  # the job runs with --no-accept-token-ids
        _request("ids", "/v1/embeddings", {"model": "minilm", "input": [7592, 2088]}),
        400,
        "takes text, not token ids (--no-accept-token-ids): send the text itself (LangChain: "
        "OpenAIEmbeddings(..., check_embedding_ctx_length=False))",
    ),
]


def _write_batch(path: Path) -> list[str]:
    """The good lines with the bad ones and a blank line among them."""
    lines = _good_lines()
    for offset, (line, _, _) in enumerate(BAD):
        lines.insert(2 + 7 * offset, line)
    lines.insert(20, "")
    path.write_text("\n".join(lines) + "\n")
    return lines


BULK = {"X-Ember-Priority": "bulk"}  # batch lines' lane (docs/operations/lanes.md)


def _stable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


def _same(got: Any, want: Any) -> bool:
    """Equal structure and values, floats within 1e-5 (the job's batches are not the
    server's: the same vectors, up to float rounding)."""
    if isinstance(got, dict):
        return (
            isinstance(want, dict)
            and got.keys() == want.keys()
            and all(_same(got[k], want[k]) for k in got)
        )
    if isinstance(got, list):
        return isinstance(want, list) and len(got) == len(want) and all(map(_same, got, want))
    if isinstance(got, float) or isinstance(want, float):
        return abs(got - want) < 1e-5
    return got == want


def _checkpoint(results: Path) -> dict[str, Any]:
    try:
        return json.loads(results.with_name(results.name + ".ember-job.json").read_text())
    except (OSError, ValueError):
        return {}  # not written yet (or being replaced: the rename is atomic, reads are not)


@pytest.mark.slow
def test_killed_batch_resumes_with_every_custom_id_once(
    tmp_path: Path, minilm_path: Path, server: ServerProcess
) -> None:
    batch, results, log = tmp_path / "batch.jsonl", tmp_path / "results.jsonl", tmp_path / "log"
    lines = _write_batch(batch)
    cmd = [
        sys.executable, "-m", "ember", "embed", str(batch), "--output", str(results),
        "--model-id", str(minilm_path), "--served-model-name", "minilm", "--shard-rows",
        str(COMMIT), "--cache-dir", os.environ["EMBER_CACHE_DIR"], "--no-progress",
        "--no-accept-token-ids", "--dtype", "float32",
    ]  # fmt: skip
    env = child_env(drop_prefixes=("EMBER_",))
    with log.open("ab") as fh:
        first = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 240
        while _checkpoint(results).get("lines_done", 0) < 6 * COMMIT:
            assert first.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no results committed in 240 s"
            time.sleep(0.01)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    killed = _checkpoint(results)
    assert first.returncode == -signal.SIGKILL and not killed["complete"]
    assert killed["lines_done"] < len(lines)

    second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    answered = len(lines) - 1  # the blank line answers nothing
    assert summary["requests"] == answered and summary["errors"] == len(BAD)
    assert summary["resumed_from"] == killed["requests"] > 0
    assert summary["requests_this_run"] == answered - summary["resumed_from"]

    out = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(out) == answered
    ids = [o["custom_id"] for o in out if o["custom_id"] is not None]
    assert sorted(ids) == sorted(
        {*(f"req-{i}" for i in range(LINES)), "bad-url", "bad-body", "bad-task", "ids"}
    )
    assert len(ids) == len(set(ids))  # every custom_id exactly once
    for o in out:
        assert set(o) == {"id", "custom_id", "response", "error"}
        assert set(o["response"]) == {"status_code", "request_id", "body"}

    # A bad line: its own status, the route's error body, the Batch API's error object.
    failed = [o for o in out if o["error"] is not None]
    assert len(failed) == len(BAD)
    for o, (_, status, says) in zip(failed, BAD, strict=True):
        assert o["response"]["status_code"] == status, o
        assert says in o["error"]["message"] and says in o["response"]["body"]["error"]["message"]
        assert o["response"]["body"]["error"]["code"] == status
        assert isinstance(o["error"]["line"], int)
    assert [o["custom_id"] for o in failed][:2] == [None, None]

    # Bodies from both runs, around where the second picked up, are the HTTP routes' own.
    sent = [line for line in lines if line.strip()]  # results come in input order
    resumed = summary["resumed_from"]
    picks = {0, 1, 9, resumed - 2, resumed - 1, resumed, resumed + 1, answered - 1}
    with server.client() as client:
        for k in sorted(picks):
            if out[k]["error"] is not None:
                continue
            request = json.loads(sent[k])
            assert out[k]["custom_id"] == request["custom_id"]
            # a batch line runs in the bulk lane: its answer is the route's to a bulk request
            want = client.post(request["url"], json=request["body"], headers=BULK)
            assert want.status_code == out[k]["response"]["status_code"] == 200
            assert _same(_stable(out[k]["response"]["body"]), _stable(want.json())), request


@pytest.mark.asyncio
async def test_rerank_and_score_lines_answer_as_their_routes(
    tmp_path: Path, tiny_reranker_path: Path, server: ServerProcess
) -> None:
    """Rerank and score urls, run in-process: each body what the server's route answers."""
    query, docs = "what is a reranker", ["it orders documents", "a fruit", "it scores pairs"]
    m = "reranker"
    requests = [
        ("cohere", "/v1/rerank", {"model": m, "query": query, "documents": docs, "top_n": 2}),
        ("tei", "/rerank", {"model": m, "query": query, "texts": docs}),
        ("score", "/score", {"model": m, "text_1": query, "text_2": docs}),
        ("pairs", "/v1/score", {"model": m, "text_1": [query, "fruit"], "text_2": docs[:2]}),
        ("empty", "/score", {"model": m, "text_1": query, "text_2": []}),
    ]
    batch, results = tmp_path / "batch.jsonl", tmp_path / "results.jsonl"
    batch.write_text("".join(_request(*r) + "\n" for r in requests))
    settings = settings_from_env(model_id=str(tiny_reranker_path), served_model_name="reranker")
    engines = EngineArray(settings.model_specs())
    await engines.start()
    try:
        options = {
            "job": {"test": 1},
            "in_flight": 64,
            "commit_lines": 2,
            "max_client_batch_size": 64,
        }
        summary = await run_batch_job(engines, batch, results, **options)
        again = await run_batch_job(engines, batch, results, **options)  # complete: nothing
        # As if killed after two lines with half a line written past the checkpoint: the
        # resume cuts the file back and answers the rest once, and a custom_id repeated
        # after the resume point is still refused (its result names no custom_id).
        written = results.read_bytes().splitlines(keepends=True)
        checkpoint = results.with_name(results.name + ".ember-job.json")
        state = json.loads(checkpoint.read_text())
        done = len(written[0]) + len(written[1])
        state.update(lines_done=2, bytes=done, requests=2, errors=0, complete=False)
        first_two = b"".join(batch.read_bytes().splitlines(keepends=True)[:2])
        state["input_digest"] = hashlib.sha256(first_two).hexdigest()
        checkpoint.write_text(json.dumps(state))
        results.write_bytes(b"".join(written) + b'{"id": "batch_req_torn')
        with batch.open("a") as fh:
            fh.write(_request("cohere", "/score", {"text_1": "q", "text_2": "d"}) + "\n")
        resumed = await run_batch_job(engines, batch, results, **options)
        # An input edited before the resume point (same size) is refused, saying so.
        batch.write_text(batch.read_text().replace("a fruit", "a frUit", 1))
        with pytest.raises(ConfigError, match=r"changed since .* its first 6 lines differ"):
            await run_batch_job(engines, batch, results, **options)
    finally:
        await engines.stop()
    assert (summary.requests, summary.errors) == (len(requests), 1)
    assert (again.requests_this_run, again.resumed_from) == (0, len(requests))
    assert (resumed.resumed_from, resumed.requests, resumed.errors) == (2, 6, 2)
    out = [json.loads(line) for line in results.read_text().splitlines()]
    assert [o["custom_id"] for o in out] == [r[0] for r in requests] + [None]
    assert "custom_id 'cohere' repeats" in out[-1]["error"]["message"]
    assert out[:2] == [json.loads(line) for line in written[:2]]  # kept, not run again
    with server.client() as client:
        for o, (_, url, body) in zip(out[: len(requests)], requests, strict=True):
            want = client.post(url, json=body, headers=BULK)
            assert o["response"]["status_code"] == want.status_code
            if want.status_code == 200:
                assert _same(_stable(o["response"]["body"]), _stable(want.json())), url
            else:
                assert o["response"]["body"] == want.json() and o["error"]["line"] == 5
