"""The examples a user copies from are run here, so they stay true."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import API_KEY
from tests.support import REPO, ServerProcess


def _run(script: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / script)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **env},
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _server_env(server: ServerProcess) -> dict[str, str]:
    return {
        "EMBER_URL": server.url,
        "EMBER_API_KEY": API_KEY,
        "EMBED_MODEL": "minilm",
        "RERANK_MODEL": "reranker",
    }


def test_openai_client_example(server: ServerProcess) -> None:
    out = _run("openai_client.py", _server_env(server))
    assert "3 vectors of 384 dims" in out and "Matryoshka: 128 dims" in out


def test_rag_rerank_example(server: ServerProcess) -> None:
    out = _run("rag_rerank.py", _server_env(server))
    assert "retrieved:" in out and "Paris is the capital of France." in out.split("retrieved:")[1]
    assert len([line for line in out.splitlines() if line[:1].isdigit()]) == 2


def test_embedded_example() -> None:
    out = _run("embedded.py", {})
    assert "(3, 384) normalised: True" in out and "Matryoshka: (1, 192)" in out


def test_ray_example() -> None:
    pytest.importorskip("ray", reason="the ray extra is not installed")
    out = _run("ray_embed.py", {})
    assert "100 rows, 384 dims, refused: 0" in out and "bread~sourdough:" in out
