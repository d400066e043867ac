"""Shared fixtures: the packaged MiniLM, tiny models built here, and a real server."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ServerProcess, start_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `--backend auto` exports ONNX graphs: keep this run's out of the user's ~/.cache/ember
# (servers and examples started by the tests inherit it).
if "EMBER_CACHE_DIR" not in os.environ:
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-test-cache-")
    atexit.register(shutil.rmtree, os.environ["EMBER_CACHE_DIR"], ignore_errors=True)

API_KEY = "test-key-123"
# cache_server's keys file: one more key besides API_KEY, limited to the model minilm-b.
MINILM_B_KEY = "test-key-minilm-b-only"


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    from ember.models.resolve import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def minilm_graphs(tmp_path_factory: pytest.TempPathFactory, minilm_path: Path) -> dict[str, Path]:
    """MiniLM as a hub repo ships its graph (unfused, ``onnx/model.onnx`` beside the
    weights) and as ``ember export --backend onnx`` writes it (made here, with torch): what
    the torch-free install serves (tests/integration/test_torch_free.py,
    tests/platforms/test_release.py)."""
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


@pytest.fixture(scope="session")
def minilm_ir(tmp_path_factory: pytest.TempPathFactory, minilm_graphs: dict[str, Path]) -> Path:
    """MiniLM as sentence-transformers saves it with ``backend="openvino"`` and no ONNX
    graph beside it: ``openvino/openvino_model.xml`` (+ ``.bin``, float32 weights), here
    converted from the hub graph with OpenVINO's own converter."""
    import openvino

    folder = tmp_path_factory.mktemp("ir") / "minilm-openvino"
    shutil.copytree(minilm_graphs["hub"], folder, ignore=shutil.ignore_patterns("onnx"))
    (folder / "openvino").mkdir()
    graph = openvino.convert_model(str(minilm_graphs["hub"] / "onnx" / "model.onnx"))
    openvino.save_model(graph, folder / "openvino" / "openvino_model.xml", compress_to_fp16=False)
    return folder


@pytest.fixture(scope="session")
def tiny_reranker_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_models import build_tiny_reranker

    return build_tiny_reranker(tmp_path_factory.mktemp("tiny-reranker"))


@pytest.fixture(scope="session")
def tiny_classifier_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.tiny_models import build_tiny_classifier

    return build_tiny_classifier(tmp_path_factory.mktemp("tiny-classifier"))


@pytest.fixture(scope="session")
def server(
    minilm_path: Path, tiny_reranker_path: Path, tiny_classifier_path: Path
) -> Iterator[ServerProcess]:
    """`ember serve` as a user runs it: three models, an API key, small limits, on the
    exact path (``--dtype float32``): the tests on it compare with the reference libraries
    at float32's tolerances, on any CPU kind; auto's near-exact bf16 choice has its own
    (tests/unit/test_near_exact.py, tests/integration/test_near_exact_serving.py)."""
    models = f"{minilm_path};{tiny_reranker_path};{tiny_classifier_path}"
    names = "minilm;reranker;classifier"
    with start_server(
        [
            "--model-id",
            models,
            "--served-model-name",
            names,
            "--api-key",
            API_KEY,
            "--payload-limit",
            "200000",
            "--max-client-batch-size",
            "64",
            "--max-batch-tokens",
            "4096",
            "--dtype",
            "float32",
        ],
        api_key=API_KEY,
    ) as proc:
        yield proc


@pytest.fixture(scope="session")
def cache_server(
    minilm_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """`ember serve` with the embedding cache on, for the cache and request-id tests: MiniLM
    twice under two names (the same files: only the name tells them apart), a SPLADE and a
    ColBERT, on torch; an API key, debug logs (uvicorn's access line per request), and a
    queue of two inputs on ``minilm-b`` so a three-input request gets 413 (more than it can
    ever take). Beside the API key, a keys file with one key (``MINILM_B_KEY``) that may
    use ``minilm-b`` only."""
    from ember.api.keys import hash_key
    from tests.fixtures.retrieval_models import build_tiny_colbert, build_tiny_splade

    root = tmp_path_factory.mktemp("cache-server")
    keys = root / "keys.toml"
    keys.write_text(
        f'[[keys]]\nname = "minilm-b-only"\nhash = "{hash_key(MINILM_B_KEY)}"\n'
        'models = ["minilm-b"]\n'
    )
    models = [minilm_path, minilm_path, build_tiny_splade(root / "splade")]
    models.append(build_tiny_colbert(root / "colbert"))
    with start_server(
        [
            "--model-id",
            ";".join(map(str, models)),
            "--served-model-name",
            "minilm;minilm-b;splade;colbert",
            "--max-queue-size",
            "4096;2;4096;4096",
            "--backend",
            "torch",  # no ONNX export to wait for (20-30 s a model here)
            "--cache-entries",
            "1000",
            "--api-key",
            API_KEY,
            "--api-keys-file",
            str(keys),
            "--log-level",
            "debug",
        ],
        api_key=API_KEY,
    ) as proc:
        yield proc
