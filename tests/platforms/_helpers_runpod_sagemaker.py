"""Process helpers for the RunPod and SageMaker adapter tests.

These tests start real servers (RunPod's own local API server, the SageMaker ``serve``
entrypoint, a moto server) as subprocesses on 127.0.0.1, because what matters is the
behaviour a deployed container shows on the wire, not what a function returns in-process.
Waiting and stopping reuse ``tests.support`` (process groups, bounded waits).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from tests.support import REPO, free_port, stop_process, wait_ready

PYTHON = sys.executable
__all__ = [
    "PYTHON",
    "REPO",
    "Running",
    "child_env",
    "free_port",
    "load_module",
    "max_abs_diff",
    "running",
]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment with the core importable, Hugging Face offline, plus extras."""
    env = dict(os.environ)
    paths = [str(REPO / "core"), str(REPO)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


@dataclass
class Running:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:]


@contextmanager
def running(
    cmd: list[str],
    *,
    port: int,
    log_path: Path,
    env: Mapping[str, str],
    ready_path: str,
    timeout: float = 240.0,
) -> Iterator[Running]:
    """Start ``cmd`` in its own process group; yield once ``ready_path`` answers 200."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_path, path=ready_path, timeout=timeout)
        yield Running(url, process, log_path)
    finally:
        stop_process(process)


def load_module(path: Path, name: str) -> ModuleType:
    """Import a platform script by path: platforms/ holds deployable files, not a package."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def max_abs_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) for x, y in zip(a, b, strict=True))
