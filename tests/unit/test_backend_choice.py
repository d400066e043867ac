"""``--backend auto``: onnx on CPU with onnxruntime installed, torch otherwise, and an
``ember export`` directory served by the backend that wrote it."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ember import cpu
from ember.backends import choice, load_backend
from ember.config import ServerSettings
from ember.families.resolve import resolve_model
from ember.models.spec import ModelSpec, ResolvedModel


@pytest.fixture()
def cpu_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """No accelerator and onnxruntime present, whatever this machine has."""
    monkeypatch.setattr(choice, "accelerator_visible", lambda: None)
    monkeypatch.setattr(choice, "onnxruntime_installed", lambda: True)
    monkeypatch.setattr(cpu, "native_bf16", lambda: None)  # fp32: test_near_exact forces bf16


def _minilm(**spec: object) -> ResolvedModel:
    return resolve_model(ModelSpec(model_id="", **spec))  # type: ignore[arg-type]


def test_auto_is_the_default_everywhere() -> None:
    assert ModelSpec(model_id="x").backend == "auto"
    assert ServerSettings().model_specs()[0].backend == "auto"


@pytest.mark.usefixtures("cpu_host")
@pytest.mark.parametrize("dtype", ["auto", "float32"])  # int8, per CPU kind: test_fast_tier
@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_cpu_with_onnxruntime_gets_onnx(device: str, dtype: str) -> None:
    picked = choice.choose_backend(_minilm(device=device, dtype=dtype))
    # Pinned to cpu: onnxruntime-gpu would otherwise pick its CUDA provider here.
    assert (picked.backend, picked.device) == ("onnx", "cpu")


@pytest.mark.usefixtures("cpu_host")
@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"device": "cuda"}, "--device cuda"),
        ({"dtype": "bfloat16"}, "--dtype bfloat16"),
        ({"dtype": "float16"}, "--dtype float16"),
        ({"torch_compile": True}, "--torch-compile"),
        ({"trust_remote_code": True}, "remote-code"),
    ],
)
def test_what_onnx_cannot_serve_as_asked_goes_to_torch(spec: dict, reason: str) -> None:
    picked = choice.choose_backend(_minilm(**spec))
    assert picked.backend == "torch" and reason in picked.reason


def test_a_visible_accelerator_goes_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "onnxruntime_installed", lambda: True)
    monkeypatch.setattr(choice, "accelerator_visible", lambda: "cuda")
    assert choice.choose_backend(_minilm()) == choice.Choice("torch", "a cuda device is visible")
    # An explicit --device cpu still gets the CPU engine.
    assert choice.choose_backend(_minilm(device="cpu")).backend == "onnx"


def test_without_onnxruntime_torch_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(choice, "accelerator_visible", lambda: None)
    monkeypatch.setattr(choice, "onnxruntime_installed", lambda: False)
    picked = choice.choose_backend(_minilm())
    assert picked.backend == "torch" and "pip install 'ember[cpu]'" in picked.reason


def test_accelerator_probe_matches_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe reads device nodes, not torch: on a Linux host without GPU nodes it
    reports none (the CI machines), an empty CUDA_VISIBLE_DEVICES hides any, and it never
    imports torch."""
    had_torch = "torch" in sys.modules
    dev = Path("/dev")
    gpu_nodes = [*dev.glob("nvidia[0-9]*"), *(p for p in (dev / "kfd", dev / "dxg") if p.exists())]
    found = choice.accelerator_visible()
    if sys.platform == "linux":
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES", "unset").strip() in ("", "-1")
        assert (found is not None) == (bool(gpu_nodes) and not hidden)
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        assert choice.accelerator_visible() is None
    assert ("torch" in sys.modules) == had_torch


@pytest.mark.usefixtures("cpu_host")
@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        # Where each `ember export` writes its manifest (see test_export for real ones).
        ("ember_artifact.json", "neuron"),
        ("ct2/ember_artifact.json", "ct2"),
        ("ember_artifact.json", "onnx"),
    ],
)
def test_an_export_directory_keeps_its_backend(
    tmp_path: Path, manifest: str, expected: str
) -> None:
    model = _minilm()
    exported = tmp_path / "exported"
    shutil.copytree(model.path, exported)
    (exported / manifest).parent.mkdir(exist_ok=True)
    (exported / manifest).write_text(json.dumps({"backend": expected}))
    picked = choice.choose_backend(replace(model, path=exported))
    assert (picked.backend, picked.exported) == (expected, True)
    assert f"--backend {expected}" in picked.reason


@pytest.mark.usefixtures("cpu_host")
@pytest.mark.parametrize("ir", ["openvino/openvino_model.xml", "openvino_model.xml"])
def test_a_folder_shipping_only_an_openvino_ir_is_served_from_it(tmp_path: Path, ir: str) -> None:
    """sentence-transformers' OpenVINO save (or optimum-intel's root layout) with no ONNX
    graph: auto serves that IR on openvino, torch or not, with no fallback; an ONNX graph
    beside it keeps the onnx path."""
    pytest.importorskip("openvino")
    model = _minilm()
    folder = tmp_path / "saved"
    shutil.copytree(model.path, folder)
    (folder / ir).parent.mkdir(exist_ok=True)
    (folder / ir).write_text("<net/>")
    (folder / ir).with_suffix(".bin").write_bytes(b"")
    picked = choice.choose_backend(replace(model, path=folder))
    assert (picked.backend, picked.device, picked.shipped) == ("openvino", "cpu", True)
    assert f"ships an OpenVINO IR ({ir})" in picked.reason
    (folder / "onnx").mkdir(exist_ok=True)
    (folder / "onnx" / "model.onnx").write_bytes(b"")
    assert choice.choose_backend(replace(model, path=folder)).backend == "onnx"


@pytest.mark.usefixtures("cpu_host")
def test_loaded_backend_reports_the_choice(tmp_path: Path) -> None:
    """Through the real loader: /info's details say auto chose it, and why."""
    backend = load_backend(_minilm(device="cpu", cache_dir=tmp_path))
    try:
        assert backend.info.name == "onnx"
        assert backend.info.details["chosen"] == (
            "auto: CPU with onnxruntime installed; "
            "float32 (this CPU has no native bf16 (AVX512-BF16 or AMX))"
        )
    finally:
        backend.close()


@pytest.mark.usefixtures("cpu_host")
def test_when_the_chosen_onnx_fails_torch_serves_and_says_why(tmp_path: Path) -> None:
    """A cache dir that cannot be created (a file is in the way) fails the onnx build."""
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    backend = load_backend(_minilm(device="cpu", cache_dir=blocked / "cache"))
    try:
        assert backend.info.name == "torch"
        chosen = backend.info.details["chosen"]
        assert chosen.startswith("auto: CPU with onnxruntime installed, but onnx failed (")
        assert chosen.endswith(
            "), so torch; float32 (this CPU has no native bf16 (AVX512-BF16 or AMX))"
        )
    finally:
        backend.close()


def test_an_explicit_backend_never_falls_back(tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    with pytest.raises(OSError):
        load_backend(_minilm(backend="onnx", device="cpu", cache_dir=blocked / "cache"))


def _conditional(model: ResolvedModel, backend: str, met: bool) -> ResolvedModel:
    """``model`` with its family running ``backend`` only on a condition it meets or not."""
    from ember.families.base import Condition

    condition = Condition(backend, "a test condition", lambda _: met, "the test says so")
    return replace(model, family=replace(model.family, conditions=(condition,)))


@pytest.mark.usefixtures("cpu_host")
def test_auto_never_picks_a_backend_whose_condition_the_model_fails() -> None:
    met = choice.choose_backend(_conditional(_minilm(), "onnx", met=True))
    assert (met.backend, met.device) == ("onnx", "cpu")
    failed = choice.choose_backend(_conditional(_minilm(), "onnx", met=False))
    assert failed == choice.Choice("torch", "onnx runs dense models only with a test condition")


def test_a_conditional_only_backend_the_model_fails_is_refused() -> None:
    from ember.errors import ConfigError

    model = _minilm()
    only = replace(model.family, backends=("onnx",))
    model = _conditional(replace(model, family=only), "onnx", met=False)
    with pytest.raises(ConfigError, match="onnx runs only with a test condition: the test says"):
        choice.choose_backend(model)
    with pytest.raises(ConfigError, match="no backend runs it"):  # asked for by name too
        load_backend(replace(model, spec=replace(model.spec, backend="onnx")))
