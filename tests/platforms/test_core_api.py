"""What adapters get from the core's public API (``ember.platform``), and that they use
nothing else: open paths they declare, export detection, runtime pre-import, readiness."""

from __future__ import annotations

import ast
import sys
from importlib.util import find_spec
from pathlib import Path

import httpx
import pytest

from ember.backends import artifacts
from ember.engine import EmbedRequest
from ember.errors import ConfigError
from ember.families.resolve import resolve_model
from ember.models.spec import ResolvedModel
from ember.platform import (
    create_app,
    exported_backend,
    import_backend,
    preload_runtime,
    preload_weights,
    settings_from_env,
)
from tests.support import REPO

PUBLIC = ("ember.platform", "ember.engine")


def _core_imports(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return {m for m in modules if m == "ember" or m.startswith("ember.")}


def test_adapters_import_only_the_public_core() -> None:
    adapters = sorted((REPO / "platforms").rglob("*.py"))
    assert len(adapters) >= 4
    reached = {
        str(path.relative_to(REPO)): sorted(_core_imports(path) - set(PUBLIC)) for path in adapters
    }
    assert {path: modules for path, modules in reached.items() if modules} == {}


async def test_a_probe_is_open_only_when_the_adapter_declares_it(minilm_path: Path) -> None:
    settings = settings_from_env(model_id=str(minilm_path), api_key="secret")
    for declared, expected in (((), 401), (("/ping",), 200)):
        app = create_app(settings, open_paths=declared)

        async def ping() -> dict[str, str]:
            return {"status": "ok"}

        app.add_api_route("/ping", ping)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/ping")).status_code == expected, declared
            assert (await client.get("/ready")).status_code == 503  # open, still loading
            resp = await client.post("/v1/embeddings", json={"input": "x"})
            assert resp.status_code == 401  # declaring a probe opens nothing else
            headers = {"Authorization": "Bearer secret"}
            assert (await client.get("/ping", headers=headers)).status_code == 200


def test_readiness_is_what_ready_answers(minilm_path: Path) -> None:
    app = create_app(settings_from_env(model_id=str(minilm_path)))
    answer = app.readiness()
    assert answer.status_code == 503 and b"loading" in answer.body


def test_exported_backend_reads_the_export_manifest(tmp_path: Path) -> None:
    def directory(name: str, manifest: dict | None = None, under: str = "") -> Path:
        path = tmp_path / name
        (path / under).mkdir(parents=True)
        if manifest is not None:
            artifacts.write_manifest(path / under, manifest)
        return path

    assert exported_backend(directory("onnx", {"backend": "onnx"})) == "onnx"
    assert exported_backend(directory("ct2", {"backend": "ct2"}, under="ct2")) == "ct2"
    assert exported_backend(directory("neuron", {"backend": "neuron"})) == "neuron"
    assert exported_backend(directory("plain")) is None
    assert exported_backend(directory("torch", {"backend": "torch"})) is None  # exports nothing
    assert exported_backend(directory("ct2-top", {"backend": "ct2"})) is None  # not its place
    assert exported_backend(tmp_path / "missing") is None


def test_preload_runtime_imports_what_the_models_will_load_with(minilm_path: Path) -> None:
    def model(**options: str) -> ResolvedModel:
        (spec,) = settings_from_env(model_id=str(minilm_path), **options).model_specs()
        return resolve_model(spec)

    assert preload_runtime([model(backend="torch")]) == ["torch"]
    assert "ember.backends.torch_backend" in sys.modules and "transformers" in sys.modules
    # auto, with the GPU a container will get but has not yet: torch, as serving will pick
    assert preload_runtime([model()], accelerator="cuda") == ["torch"]
    if find_spec("onnxruntime") is not None:
        cpu = preload_runtime([model(device="cpu")], accelerator="cuda")
        assert cpu == ["onnx"] and "onnxruntime" in sys.modules
    with pytest.raises(ConfigError, match="unknown backend"):
        import_backend("tensorflow")


async def test_preloaded_weights_are_taken_not_loaded_again(
    minilm_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Modal loads weights on the CPU before its memory snapshot (``enter(snap=True)``) and
    builds engines after restore: the backend takes the preloaded network and only moves it
    to its device. Checked on CPU: one load from disk in all, and the same vectors."""
    import numpy as np

    from ember.backends import torch_backend
    from ember.engine import EngineArray
    from ember.families.resolve import resolve_model

    settings = settings_from_env(model_id=str(minilm_path), backend="torch")
    (spec,) = settings.model_specs()
    loads: list[str] = []
    real_load = torch_backend.load_net

    def counting_load(*args, **kwargs):  # type: ignore[no-untyped-def]
        loads.append("disk")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch_backend, "load_net", counting_load)
    assert preload_weights([resolve_model(spec)], accelerator="cuda") == [spec.model_id]
    assert loads == ["disk"]
    # onnx models are not torch's to preload
    (onnx_spec,) = settings_from_env(model_id=str(minilm_path), backend="onnx").model_specs()
    assert preload_weights([resolve_model(onnx_spec)]) == []
    # the cuda dtype (float16) was preloaded; a CPU engine (float32) loads its own
    engines = EngineArray([spec])
    await engines.start()
    try:
        assert loads == ["disk", "disk"]
        want = (await engines.get(None).embed(EmbedRequest(["a cat on a mat"]))).outputs
    finally:
        await engines.stop()
    torch_backend._PRELOADED.clear()
    assert preload_weights([resolve_model(spec)]) == [spec.model_id]  # for the CPU: float32
    engines = EngineArray([spec])
    await engines.start()
    try:
        assert loads == ["disk", "disk", "disk"]  # taken from the preload, not loaded again
        got = (await engines.get(None).embed(EmbedRequest(["a cat on a mat"]))).outputs
    finally:
        await engines.stop()
    assert np.array_equal(got, want)
