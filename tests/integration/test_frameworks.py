"""docs/frameworks.md's snippets, run with the frameworks' own clients against a real server.

The frameworks pin packages that clash with Ember's venv, so they live in a venv of their own
(benchmarks/.venv-frameworks, built here by uv from tests/frameworks/requirements.txt, --no-deps:
that file is the whole install, and holds no torch). A venv built from the same file is reused;
a failed or slow build fails the tests, it never skips them. All snippets run in one
subprocess (one import of each framework); each is then checked on its own: vectors equal to
/v1/embeddings within 1e-5, ranking (order and scores) equal to /v1/rerank.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import API_KEY
from tests.support import REPO, ServerProcess, start_server

PAGE = REPO / "docs" / "frameworks.md"
REQUIREMENTS = REPO / "tests" / "frameworks" / "requirements.txt"
RUNNER = REPO / "tests" / "frameworks" / "run_snippets.py"
VENV = REPO / "benchmarks" / ".venv-frameworks"
INSTALL_TIMEOUT_S = 420
# What the page says -> what the test server serves.
PLACEHOLDERS = {
    "sentence-transformers/all-MiniLM-L6-v2": "minilm",
    "cross-encoder/ms-marco-MiniLM-L6-v2": "reranker",
    "my-key": API_KEY,
}
# The frameworks' own network calls at import (LiteLLM's price list from GitHub, telemetry):
# off, so the run needs only the server.
OFFLINE = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "HAYSTACK_TELEMETRY_ENABLED": "False",
    "ANONYMIZED_TELEMETRY": "False",
    "DSP_CACHEBOOL": "False",
}
TAGS = re.findall(r"<!-- snippet: ([\w-]+)( \(no key\))? -->", PAGE.read_text())
NAMES = [name for name, _ in TAGS]
NO_KEY = {name for name, no_key in TAGS if no_key}


def _pins() -> list[str]:
    return [ln for ln in REQUIREMENTS.read_text().splitlines() if ln and not ln.startswith("#")]


def test_pins_are_exact_and_hold_no_torch() -> None:
    """--no-deps installs exactly this list: every line must pin, and none be torch/CUDA."""
    pins = _pins()
    assert pins and all(re.fullmatch(r"[A-Za-z0-9._-]+==[\w.+!-]+", p) for p in pins), pins
    assert not [p for p in pins if re.match(r"(torch|nvidia|triton)\b", p, re.I)]


def _uv(*args: str) -> subprocess.CompletedProcess[str]:
    """uv, not pip: a cold install of this list takes 18 s with uv, 79 s with pip (here)."""
    command = [sys.executable, "-m", "uv", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)


def _venv_python() -> Path:
    """Build (or reuse) the frameworks' venv; any failure fails the tests that need it."""
    python, stamp = VENV / "bin" / "python", VENV / "requirements.txt"
    if python.exists() and stamp.exists() and stamp.read_text() == REQUIREMENTS.read_text():
        return python
    shutil.rmtree(VENV, ignore_errors=True)
    for step in (
        ("venv", "--python", sys.executable, str(VENV)),
        ("pip", "install", "--no-deps", "--python", str(python), "-r", str(REQUIREMENTS)),
    ):
        done = _uv(*step)
        assert done.returncode == 0, f"uv {step}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    check = _uv("pip", "check", "--python", str(python))
    # chromadb alone is installed without its database's tree (see the requirements file).
    problems = [ln for ln in (check.stdout + check.stderr).splitlines() if "requires" in ln]
    assert check.returncode in (0, 1), check.stderr
    assert all(ln.startswith("The package `chromadb`") for ln in problems), problems
    shutil.copyfile(REQUIREMENTS, stamp)
    return python


@pytest.fixture(scope="module")
def keyless_server(minilm_path: Path) -> Iterator[ServerProcess]:
    """MiniLM without --api-key, for the clients that cannot send one."""
    with start_server(["--model-id", str(minilm_path), "--served-model-name", "minilm"]) as proc:
        yield proc


@pytest.fixture(scope="module")
def results(server: ServerProcess, keyless_server: ServerProcess) -> dict[str, dict]:
    python = _venv_python()
    subs = {
        "key": {"http://localhost:7997": server.url, **PLACEHOLDERS},
        "no key": {"http://localhost:7997": keyless_server.url, **PLACEHOLDERS},
    }
    # HF_HUB_OFFLINE (set for the suite) would make huggingface_hub refuse even our server.
    dropped = ("PYTHONPATH", "HF_HUB_OFFLINE")
    env = {k: v for k, v in os.environ.items() if k not in dropped} | OFFLINE
    done = subprocess.run(
        [str(python), str(RUNNER), str(PAGE), json.dumps(subs)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=Path(os.environ.get("TMPDIR", "/tmp")),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_page_has_a_snippet_per_framework_and_the_readme_links_it() -> None:
    for framework in ("langchain", "llamaindex", "haystack", "chroma", "litellm", "dspy"):
        assert any(n.startswith(framework) for n in NAMES), framework
    assert "(docs/frameworks.md)" in (REPO / "README.md").read_text()


def _post(server: ServerProcess, path: str, body: dict) -> dict:
    with server.client() as http:
        answer = http.post(path, json=body)
    answer.raise_for_status()
    return answer.json()


@pytest.mark.parametrize("name", NAMES)
def test_snippet(
    server: ServerProcess, keyless_server: ServerProcess, results: dict[str, dict], name: str
) -> None:
    got = results[name]
    if name in NO_KEY:
        server = keyless_server
    assert "error" not in got, got.get("error")
    if "vectors" in got:
        own = _post(server, "/v1/embeddings", {"model": "minilm", "input": got["texts"]})["data"]
        assert len(got["vectors"]) == len(own)
        np.testing.assert_allclose(got["vectors"], [d["embedding"] for d in own], atol=1e-5)
    else:
        body = {"model": "reranker", "query": got["query"], "documents": got["documents"]}
        own = _post(server, "/v1/rerank", {**body, "top_n": len(got["ranking"])})["results"]
        assert [i for i, _ in got["ranking"]] == [r["index"] for r in own]
        np.testing.assert_allclose(
            [s for _, s in got["ranking"]], [r["relevance_score"] for r in own], atol=1e-5
        )
