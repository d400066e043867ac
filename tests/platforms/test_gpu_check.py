"""A GPU host where torch sees no CUDA fails at start instead of serving on the CPU.

The platform images ship a CUDA 13 torch; on a host whose driver is older (SageMaker's
default GPU AMIs) torch reports no CUDA and ``--device auto`` used to fall back to the
CPU without a word. Device nodes are faked in a temporary /dev; this machine's torch
really sees no CUDA, which is the state being tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ember.backends import gpu_check
from ember.errors import ConfigError


def _dev(tmp_path: Path, *nodes: str) -> Path:
    for node in nodes:
        (tmp_path / node).touch()
    return tmp_path


@pytest.mark.parametrize("nodes", [("nvidia0",), ("nvidiactl",), ("nvidiactl", "nvidia0")])
def test_a_visible_node_without_cuda_is_an_error(tmp_path: Path, nodes: tuple[str, ...]) -> None:
    dev = _dev(tmp_path, *nodes)
    with pytest.raises(ConfigError, match="torch sees no CUDA") as info:
        gpu_check.check_cuda_visible(False, "13.0", "driver too old", dev=dev, env={})
    message = str(info.value)
    assert "CUDA 13.0" in message and "R580" in message and "--device cpu" in message
    assert "driver too old" in message and str(dev / nodes[0]) in message


def test_a_cpu_only_torch_is_named_as_the_cause(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CPU-only build"):
        gpu_check.check_cuda_visible(False, None, dev=_dev(tmp_path, "nvidia0"), env={})


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_no_node_cuda_present_or_gpus_hidden_pass(tmp_path: Path, hidden: str) -> None:
    gpu_check.check_cuda_visible(False, "13.0", dev=_dev(tmp_path), env={})
    dev = _dev(tmp_path, "nvidia0", "nvidiactl")
    gpu_check.check_cuda_visible(True, "13.0", dev=dev, env={})
    gpu_check.check_cuda_visible(False, "13.0", dev=dev, env={"CUDA_VISIBLE_DEVICES": hidden})


def test_torch_backend_auto_device_refuses_cpu_on_a_gpu_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the torch backend's own device choice, as every adapter loads models."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this host has CUDA: the state under test cannot happen")
    from ember.backends import torch_backend

    real = gpu_check.check_cuda_visible
    dev = {"path": _dev(tmp_path, "nvidia0", "nvidiactl")}
    monkeypatch.setattr(
        gpu_check,
        "check_cuda_visible",
        lambda available, cuda, said=None: real(available, cuda, said, dev=dev["path"], env={}),
    )
    with pytest.raises(ConfigError, match="torch sees no CUDA"):
        torch_backend.resolve_device("auto")
    assert torch_backend.resolve_device("cpu") == "cpu"  # the explicit way out
    dev["path"] = tmp_path / "empty"
    dev["path"].mkdir()
    assert torch_backend.resolve_device("auto") == "cpu"  # a CPU host: no complaint


CUDA_BUILDS = ["torch 2.13.0", "onnxruntime-gpu 1.23.2"]


@pytest.mark.parametrize("devices", [None, "auto", "cuda", "auto,cpu"])
def test_a_cuda_install_with_no_gpu_says_so_in_one_line(
    tmp_path: Path, devices: str | None
) -> None:
    """The `cuda` image started on a machine (or a pod) that was given no GPU."""
    note = gpu_check.no_gpu_visible_note(devices, dev=_dev(tmp_path), env={}, builds=CUDA_BUILDS)
    assert note is not None and "\n" not in note
    assert note.startswith("no GPU visible (no ") and "nvidia* device node" in note
    assert "torch 2.13.0, onnxruntime-gpu 1.23.2" in note and "serves on the CPU" in note
    assert "--gpus all" in note and "--device cpu" in note


@pytest.mark.parametrize("hidden", ["", "-1"])
def test_gpus_hidden_by_cuda_visible_devices_are_named_as_the_cause(
    tmp_path: Path, hidden: str
) -> None:
    dev = _dev(tmp_path, "nvidia0", "nvidiactl")
    env = {"CUDA_VISIBLE_DEVICES": hidden}
    note = gpu_check.no_gpu_visible_note("auto", dev=dev, env=env, builds=CUDA_BUILDS)
    assert note is not None and "CUDA_VISIBLE_DEVICES hides every GPU" in note


def test_no_note_with_a_gpu_an_explicit_cpu_or_a_cpu_build(tmp_path: Path) -> None:
    gpu = _dev(tmp_path, "nvidia0", "nvidiactl")
    assert gpu_check.no_gpu_visible_note("auto", dev=gpu, env={}, builds=CUDA_BUILDS) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert gpu_check.no_gpu_visible_note("cpu", dev=empty, env={}, builds=CUDA_BUILDS) is None
    assert gpu_check.no_gpu_visible_note("cpu,cpu", dev=empty, env={}, builds=CUDA_BUILDS) is None
    assert gpu_check.no_gpu_visible_note("auto", dev=empty, env={}, builds=[]) is None


def test_this_hosts_packages_are_read_from_metadata() -> None:
    """This machine's torch is the +cpu wheel (no NVIDIA requirements) and its
    onnxruntime is the CPU package: nothing here is built for CUDA."""
    from importlib import metadata

    builds = gpu_check.cuda_builds_installed()
    try:
        cpu_torch = "+cpu" in metadata.version("torch")
    except metadata.PackageNotFoundError:
        cpu_torch = True
    if cpu_torch:
        assert not any(b.startswith("torch ") for b in builds)
    assert all(b.split()[0] in ("torch", "onnxruntime-gpu") for b in builds)
