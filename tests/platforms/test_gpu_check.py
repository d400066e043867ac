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
