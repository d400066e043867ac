"""Process helpers for the RunPod and SageMaker adapter tests.

These tests start real servers (RunPod's own local API server, the SageMaker ``serve``
entrypoint, a moto server) as subprocesses on 127.0.0.1, because what matters is the
behaviour a deployed container shows on the wire, not what a function returns in-process.
Waiting and stopping reuse ``tests.support`` (process groups, bounded waits).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.support import REPO, child_env, free_port, spawn, stop_process, wait_ready

PYTHON = sys.executable
__all__ = [
    "FakeRunPodQueue",
    "PYTHON",
    "REPO",
    "Running",
    "child_env",
    "free_port",
    "load_module",
    "max_abs_diff",
    "running",
]


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
    process = spawn(cmd, env, log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_path, path=ready_path, timeout=timeout)
        yield Running(url, process, log_path)
    finally:
        stop_process(process)


@contextmanager
def moto_server(log_dir: Path) -> Iterator[Running]:
    """moto's server (S3, SageMaker, SageMaker Runtime) on a free 127.0.0.1 port."""
    port = free_port()
    with running(
        [PYTHON, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        port=port,
        log_path=log_dir / "moto.log",
        env=child_env(),
        ready_path="/moto-api/data.json",
        timeout=60,
    ) as server:
        yield server


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


class FakeRunPodQueue:
    """RunPod's worker-facing job API, just enough for ``runpod.serverless`` worker mode.

    A deployed worker long-polls ``RUNPOD_WEBHOOK_GET_JOB`` (``/job-take/`` for one job,
    ``/job-take-batch/...&batch_size=N`` for N, N being the concurrency_modifier's value),
    posts each result to ``RUNPOD_WEBHOOK_POST_OUTPUT`` and polls ``/job-stop/``. This
    serves queued jobs from memory on 127.0.0.1 and records what comes back.
    """

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.pending = list(jobs)
        self.results: dict[str, Any] = {}
        self.batch_sizes: list[int] = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.expected = len(jobs)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def env(self, worker_id: str = "test-worker") -> dict[str, str]:
        base = f"http://127.0.0.1:{self.port}/v2"
        return {
            "RUNPOD_POD_ID": worker_id,
            "RUNPOD_WEBHOOK_GET_JOB": f"{base}/job-take/$ID?gpu=cpu",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{base}/job-done/$RUNPOD_POD_ID/$ID?gpu=cpu",
            "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true",
            "RUNPOD_SKIP_GPU_CHECK": "true",
        }

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        queue = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

            def _reply(self, status: int, body: Any = None) -> None:
                raw = b"" if body is None else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                url = urlparse(self.path)
                if "/job-take" in url.path:
                    batch = "/job-take-batch/" in url.path
                    size = int(parse_qs(url.query).get("batch_size", ["1"])[0]) if batch else 1
                    with queue.lock:
                        queue.batch_sizes.append(size)
                        jobs, queue.pending = queue.pending[:size], queue.pending[size:]
                    if not jobs:
                        time.sleep(0.2)  # the real API long-polls; don't let the worker spin
                        self._reply(204)
                    else:
                        self._reply(200, jobs if batch else jobs[0])
                else:  # /job-stop/: nothing to stop
                    time.sleep(0.2)
                    self._reply(204)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"null")
                job_id = urlparse(self.path).path.rstrip("/").rsplit("/", 1)[-1]
                with queue.lock:
                    queue.results[job_id] = body
                    if len(queue.results) >= queue.expected:
                        queue.done.set()
                self._reply(200, {})

        return Handler

    def __enter__(self) -> FakeRunPodQueue:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
