"""A model that fails to start says so in one line, for every family in the registry.

Each family's tiny model is served through the CLI's own start path (``ember.cli.main``:
uvicorn, the app's lifespan, the engines' start) with its backend's load made to fail as a
broken exporter fails (a library's own multi-line exception); the server must end with
exit status 2 and one line naming the model's family, the backend and what to use
instead, and print no traceback. A real `ember serve` whose onnx export genuinely fails
(its weights file cut short) ends the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from ember.families.registry import FAMILIES
from ember.families.table import cpu_auto
from tests.conformance.references import modules
from tests.fixtures import tiny_models as tiny
from tests.support import free_port, start_server

# One tiny model per family, by the family's registry name: the conformance kit's
# (tests/conformance/references/), so a new family's reference serves here too.
BUILDERS: dict[str, Callable[[Path], Path]] = {
    module.FAMILY: module.build for module in modules().values()
}
# What an exporter that cannot trace a network raises (the TorchScript tracer on
# EmbeddingGemma), with the lines a library adds after the first.
FAILURE = "unordered_map::at\n  while tracing Gemma3TextModel\n  (see the graph above)"


def test_every_family_has_a_model_here() -> None:
    assert sorted(BUILDERS) == sorted(f.name for f in FAMILIES)


def _failing_backend(name: str) -> SimpleNamespace:
    def load(model: object) -> None:
        raise RuntimeError(FAILURE)

    return SimpleNamespace(load=load)


def _serve(args: list[str]) -> int:
    """``ember serve ARGS`` in this process; the root logger's handlers are put back after
    (serve points them at this test's captured stderr, closed once the test ends)."""
    import logging

    from ember.cli import main

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return main(["serve", "--host", "127.0.0.1", "--port", str(free_port()), *args])
    finally:
        root.handlers[:], root.level = handlers, level


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Built before any test captures stderr: transformers' log handler keeps the stream
    it was made with, and a test's own capture is closed when the test ends."""
    root = tmp_path_factory.mktemp("families")
    return {name: build(root / name) for name, build in BUILDERS.items()}


@pytest.mark.parametrize("family", [f.name for f in FAMILIES])
def test_a_failed_export_is_one_line(
    family: str,
    models: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    import ember.backends
    from ember.families.registry import by_name

    path = models[family]
    kind = by_name(family)
    backend = "auto" if kind.backbone == "routes" else cpu_auto(kind)
    monkeypatch.setattr(ember.backends, "backend_module", _failing_backend)
    code = _serve(["--model-id", str(path), "--served-model-name", "m", "--backend", backend])
    out, err = capfd.readouterr()
    printed = out + err
    assert code == 2, printed
    assert "Traceback" not in printed, printed
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"ember: error: model 'm' ({family} model, "), last
    assert f"failed to start on --backend {backend}: RuntimeError: unordered_map::at;" in last
    assert "while tracing" not in last  # the exception's first line only
    if backend not in ("torch", "auto") and kind.runs_on("torch"):
        assert "serve it with --backend torch" in last, last


def test_a_real_failed_onnx_export_is_one_line(tmp_path: Path) -> None:
    """`ember serve --backend onnx` on a model whose weights file is cut short: the export
    (in its own build process) fails in safetensors, and the server's last words are one
    line saying so, with no traceback from either process."""
    path = tiny.build_tiny_embedder(tmp_path / "broken")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])
    args = ["--model-id", str(path), "--backend", "onnx", "--cache-dir", str(tmp_path / "c")]
    with pytest.raises(RuntimeError, match="server exited with 2") as failed:
        with start_server(args):
            pass
    log = str(failed.value)
    assert "Traceback" not in log, log
    last = log.strip().splitlines()[-1]
    assert last.startswith(f"ember: error: model '{path}' (dense model, BertModel (bert)) "), last
    assert "failed to start on --backend onnx: " in last, last
    assert last.endswith("serve it with --backend torch; --log-level debug shows the traceback")
