"""Process helpers for the RunPod and SageMaker adapter tests.

These tests start real servers (RunPod's own local API server, the SageMaker ``serve``
entrypoint, a moto server) as subprocesses on 127.0.0.1, because what matters is the
behaviour a deployed container shows on the wire, not what a function returns in-process.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import httpx

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def free_port() -> int:
    """A port nothing listens on right now (the OS picks it; races are unlikely here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment plus the core on PYTHONPATH, offline Hugging Face, extras."""
    env = dict(os.environ)
    paths = [str(REPO / "core"), str(REPO)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class ServerProcess:
    """A subprocess whose combined output goes to a log file, shown when a test fails."""

    def __init__(self, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            args, cwd=REPO, env=dict(env), stdout=self._log, stderr=subprocess.STDOUT
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def wait_http(self, url: str, timeout: float, expect_status: int = 200) -> httpx.Response:
        """Poll ``url`` until it answers ``expect_status``; fail early if the process died."""
        deadline = time.monotonic() + timeout
        last: str = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.args} exited with {self.proc.returncode} before {url} was up:\n"
                    f"{self.log()}"
                )
            try:
                resp = httpx.get(url, timeout=5.0)
                if resp.status_code == expect_status:
                    return resp
                last = f"HTTP {resp.status_code}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.25)
        raise AssertionError(f"{url} not {expect_status} after {timeout}s ({last}):\n{self.log()}")

    def stop(self) -> None:
        """SIGTERM (what RunPod and SageMaker send), then SIGKILL if it does not exit."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


@contextmanager
def running(args: list[str], env: Mapping[str, str], log_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(args, env, log_path)
    try:
        yield server
    finally:
        server.stop()


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def max_abs_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def load_module(path: Path, name: str) -> ModuleType:
    """Import a platform script by path: platforms/ holds deployable files, not a package."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
