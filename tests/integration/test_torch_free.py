"""Serving with neither torch nor transformers importable (the torch-free install,
``ember[cpu]``): MiniLM's graph as a hub repo ships it (``onnx/model.onnx``), as ``ember
export`` writes it and as sentence-transformers saves an OpenVINO model
(``openvino/openvino_model.xml``, no ONNX graph), under ``--backend auto``, at the
near-exact path (OpenVINO bf16) with the CPU kind forced, so that path is checked on any x86
host; vectors within its stated tolerance of sentence-transformers' (torch, in this
process). A model that ships no graph is refused in one line naming ``ember[export]``. The
default this host's CPU gets, served by a venv where torch was never installed (the wheel's
``ember[cpu]``), is tests/platforms/test_release.py's (the IR's, here).

The server and every child it starts (the graph's optimisation runs in one) import a
``sitecustomize`` that makes ``torch``, ``transformers`` and ``sentence_transformers``
raise ``ModuleNotFoundError``, as they do where they are not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.fixtures.graph_serving import check_served, serve_graphs, torch_reference
from tests.support import REPO, ServerProcess, child_env, free_port

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
def reference(minilm_path: Path) -> np.ndarray:
    return torch_reference(minilm_path)


@pytest.fixture(scope="module")
def bf16_default(
    minilm_graphs: dict[str, Path],
    minilm_ir: Path,
    blocker: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """The default on a CPU that multiplies bf16 natively (the kind forced, as
    tests/integration/test_near_exact_serving.py does; OpenVINO computes the bf16 hint in
    fp32 where the host has no bf16, in bf16 where it has)."""
    cache = tmp_path_factory.mktemp("cache-bf16")
    env = _env(blocker, cache, TORCH_FREE_TEST_NATIVE_BF16="avx512_bf16")
    graphs = {**minilm_graphs, "openvino": minilm_ir}
    yield from serve_graphs([sys.executable, "-m", "ember"], graphs, env, cache / "server.log")


def test_the_near_exact_default_serves_torch_free(
    bf16_default: ServerProcess, reference: np.ndarray
) -> None:
    """The hub graph, the export and the shipped OpenVINO IR (its bf16 probed against the
    IR at f32), each at the near-exact path."""
    check_served(bf16_default, reference, ("openvino", "bfloat16"), ("hub", "exported", "openvino"))


def test_a_shipped_openvino_ir_serves_torch_free_at_this_hosts_default(
    minilm_ir: Path, blocker: Path, tmp_path: Path, reference: np.ndarray
) -> None:
    """A folder with only ``openvino/openvino_model.xml`` (as sentence-transformers saves
    it), on this host's own CPU kind: OpenVINO over the IR at float32 (bf16 where the CPU
    has it natively and the probe holds), the same tokenisation and pooling as torch."""
    from ember import cpu

    env = _env(blocker, tmp_path / "cache")
    command = [sys.executable, "-m", "ember"]
    graphs = {"openvino": minilm_ir}
    server = serve_graphs(command, graphs, env, tmp_path / "server.log")
    try:
        expected = ("openvino", "bfloat16" if cpu.native_bf16() else "float32")
        check_served(next(server), reference, expected, ("openvino",))
    finally:
        server.close()


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


def test_a_shipped_graph_without_the_onnx_package_runs_unfused(
    minilm_graphs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slim image has no onnx package to fuse with: a hub repo's graph runs as shipped
    (float32), and what needs a conversion (int8) says what to install."""
    from ember.backends import onnx_export
    from ember.errors import MissingDependency
    from tests.fixtures.parity import resolved

    monkeypatch.setattr(onnx_export, "_onnx_installed", lambda: False)
    monkeypatch.setitem(sys.modules, "onnx", None)  # importing it fails, as where absent
    model = resolved(minilm_graphs["hub"], "onnx", tmp_path)
    plan = onnx_export.plan_for(model, ["CPUExecutionProvider"])
    assert onnx_export.prepare(model, plan) == minilm_graphs["hub"] / "onnx" / "model.onnx"
    int8 = resolved(minilm_graphs["hub"], "onnx", tmp_path, dtype="int8")
    with pytest.raises(MissingDependency, match=r"pip install 'ember\[cpu\]'"):
        onnx_export.prepare(int8, onnx_export.plan_for(int8, ["CPUExecutionProvider"]))
