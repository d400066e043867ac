"""A fresh process whose first OpenVINO infers come from two forward threads at once.

That is every start with a cached near-exact decision: the batcher's warm-up is the
first infer, from both forward threads. pybind11's one-time numpy lookup deadlocked
there (4 of 8 starts of ``examples/embedded.py`` hung before ``openvino_backend`` made
that lookup in the loading thread). Each start is its own process, as the lookup is
once per process; a hung one is killed at its timeout and fails the test.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support import REPO

pytest.importorskip("openvino")

# auto's near-exact path, forced on as on a bf16 CPU (OpenVINO runs the bf16 hint in
# float32 on a CPU without it, so this holds on any x86 host).
SCRIPT = """
from ember import cpu
from ember.backends import choice
from ember.engine import SyncEngineArray

cpu.native_bf16 = lambda: "avx512_bf16"
choice.accelerator_visible = lambda: None
with SyncEngineArray(device="cpu") as e:
    info = e.engines.engines[0].backend.info
    assert (info.name, info.dtype) == ("openvino", "bfloat16"), info
    for size in (1, 7, 32):
        assert e.embed(["a first infer from each forward thread"] * size).shape == (size, 384)
print("served")
"""

STARTS = 6  # without the fix, 1 to 4 in 4 starts hung here


def _start() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "EMBER_LOG_LEVEL": "warning"},
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def decided() -> None:
    """The first start probes (its first infers are single-threaded) and caches the verdict."""
    first = _start()
    assert first.returncode == 0, first.stdout + first.stderr


@pytest.mark.usefixtures("decided")
@pytest.mark.parametrize("start", range(STARTS))
def test_a_cached_decision_start_serves_from_two_forward_threads(start: int) -> None:
    result = _start()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("served")
