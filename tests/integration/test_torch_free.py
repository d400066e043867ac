"""Serving with neither torch nor transformers importable (the torch-free install,
``ember[cpu]``): MiniLM's graph as a hub repo ships it (``onnx/model.onnx``) and as
``ember export`` writes it, under ``--backend auto``, at the default path this CPU gets
(OpenVINO bf16 where it multiplies bf16 natively and the probe holds, else ONNX Runtime
fp32), and at the near-exact path with the CPU kind forced, so that path is checked on any
x86 host. Vectors are held to each tier's stated tolerance against sentence-transformers
(torch) in this process. A model that ships no graph is refused in one line naming
``ember[export]``.

The server and every child it starts (the graph's optimisation runs in one) import a
``sitecustomize`` that makes ``torch``, ``transformers`` and ``sentence_transformers``
raise ``ModuleNotFoundError``, as they do where they are not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from ember import cpu
from tests.support import REPO, ServerProcess, child_env, free_port, spawn, stop_process, wait_ready
from tests.texts import mixed_texts

TEXTS = mixed_texts(40)
# Stated tolerances (README, Backends): the exact fp32 path and the near-exact bf16 path.
EXACT_COSINE = 0.99999
NEAR_EXACT_COSINE = 0.9999

SITECUSTOMIZE = '''
import os
import sys

BLOCKED = ("torch", "transformers", "sentence_transformers", "torchvision")


class BlockTorch:
    """Finds nothing for the blocked packages: importing them fails as if not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


sys.meta_path.insert(0, BlockTorch())
if unit := os.environ.get("TORCH_FREE_TEST_NATIVE_BF16"):
    import ember.cpu

    ember.cpu.native_bf16 = lambda: unit
'''


@pytest.fixture(scope="module")
def blocker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("torch-blocked")
    (directory / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return directory


def _env(blocker: Path, cache: Path, **extra: str) -> dict[str, str]:
    env = child_env(drop_prefixes=("EMBER_",))
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), env["PYTHONPATH"]])
    env.update(EMBER_CACHE_DIR=str(cache), **extra)
    return env


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> dict[str, Path]:
    """MiniLM as a hub repo ships its graph (unfused, ``onnx/model.onnx`` beside the
    weights) and as ``ember export --backend onnx`` writes it (made here, with torch)."""
    from ember.backends.onnx_export import export, export_torch
    from tests.fixtures.parity import resolved

    root = tmp_path_factory.mktemp("graphs")
    hub = root / "hub"
    shutil.copytree(minilm_path, hub)
    (hub / "onnx").mkdir()
    raw = export_torch(resolved(minilm_path, "onnx", root / "cache"), root)
    shutil.move(raw, hub / "onnx" / "model.onnx")
    exported = export(resolved(hub, "onnx", root / "cache"), root / "exported")
    return {"hub": hub, "exported": exported}


@pytest.fixture(scope="module")
def reference(minilm_path: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_path), device="cpu")
    return model.encode(TEXTS, batch_size=8, normalize_embeddings=True)


def _serve(graphs: dict[str, Path], env: dict[str, str], log: Path) -> Iterator[ServerProcess]:
    port = free_port()
    cmd = [sys.executable, "-m", "ember", "serve", "--host", "127.0.0.1", "--port", str(port)]
    for name, path in graphs.items():
        cmd += ["--model-id", str(path), "--served-model-name", name]
    process = spawn(cmd, env, log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log)
        yield ServerProcess(url, process, log)
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def host_default(
    graphs: dict[str, Path], blocker: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The default this CPU gets, as it is."""
    cache = tmp_path_factory.mktemp("cache-host")
    yield from _serve(graphs, _env(blocker, cache), cache / "server.log")


@pytest.fixture(scope="module")
def bf16_default(
    graphs: dict[str, Path], blocker: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The default on a CPU that multiplies bf16 natively (the kind forced, as
    tests/integration/test_near_exact_serving.py does; OpenVINO computes the bf16 hint in
    fp32 where the host has no bf16, in bf16 where it has)."""
    cache = tmp_path_factory.mktemp("cache-bf16")
    env = _env(blocker, cache, TORCH_FREE_TEST_NATIVE_BF16="avx512_bf16")
    yield from _serve(graphs, env, cache / "server.log")


def _check(server: ServerProcess, reference: np.ndarray, expected: tuple[str, str]) -> None:
    """Each model served on ``expected`` (backend, dtype), its vectors within that tier's
    tolerance of torch's, and nothing in the log saying torch was wanted."""
    floor = NEAR_EXACT_COSINE if expected[1] == "bfloat16" else EXACT_COSINE
    models = {m["id"]: m for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]}
    for name in ("hub", "exported"):
        info = models[name]
        served = (info["backend"], info["dtype"])
        assert served == expected, (name, info.get("backend_details"))
        body = {"model": name, "input": TEXTS}
        answer = httpx.post(server.url + "/v1/embeddings", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        vectors = np.array([d["embedding"] for d in answer.json()["data"]])
        cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1)
        assert cosine.min() >= floor, (name, int(cosine.argmin()), float(cosine.min()))
    assert "torch" not in server.log().lower().replace("torch-free", ""), server.log()[-3000:]


def test_the_host_default_serves_torch_free(
    host_default: ServerProcess, reference: np.ndarray
) -> None:
    expected = ("openvino", "bfloat16") if cpu.native_bf16() else ("onnx", "float32")
    _check(host_default, reference, expected)


def test_the_near_exact_default_serves_torch_free(
    bf16_default: ServerProcess, reference: np.ndarray
) -> None:
    _check(bf16_default, reference, ("openvino", "bfloat16"))


def test_a_model_without_a_graph_is_refused_naming_the_export_extra(
    minilm_path: Path, blocker: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ember", "serve", "--host", "127.0.0.1"]
        + ["--port", str(free_port()), "--model-id", str(minilm_path)],
        cwd=REPO,
        env=_env(blocker, tmp_path / "cache"),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("ember: error:")]
    assert len(errors) == 1, done.stderr[-3000:]
    assert "ships no ONNX graph" in errors[0] and "pip install 'ember[export]'" in errors[0]
    assert "ember export --backend onnx" in errors[0]
