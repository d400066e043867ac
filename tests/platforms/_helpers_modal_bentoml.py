"""Helpers for the Modal and BentoML adapter tests.

The BentoML test runs the real ``bentoml serve`` as a subprocess on 127.0.0.1, in its
own process group so every worker it forks is ended with it; the Modal tests run the
app's class locally (``.local()``) and need no Modal account. Both compare what the
adapter returns with what the core's own engines return for the same models.
"""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests import support
from tests.support import free_port, stop_process, wait_ready

REPO = Path(__file__).resolve().parents[2]
BENTOML = Path(sys.executable).with_name("bentoml")

# Arguments Modal 1.x removed or renamed; none may appear in the adapter's source.
REMOVED_MODAL_ARGS = frozenset(
    {"keep_warm", "container_idle_timeout", "allow_concurrent_inputs", "concurrency_limit"}
)


def keyword_arguments(path: Path) -> set[str]:
    """Every keyword argument name used in any call in a Python file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        kw.arg
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg is not None
    }


def child_env(extra: Mapping[str, str], home: Path) -> dict[str, str]:
    """No inherited EMBER_*/MODAL_* settings (the child serves exactly the models the test
    names) and HOME in an empty directory, so no developer's Modal/BentoML config leaks in."""
    return support.child_env(
        {
            "HOME": str(home),
            "BENTOML_HOME": str(home / "bentoml"),
            "BENTOML_DO_NOT_TRACK": "true",
            **extra,
        },
        drop_prefixes=("EMBER_", "MODAL_"),
    )


@dataclass
class BentoServer:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-8000:]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60)


@contextlib.contextmanager
def bentoml_serve(env: Mapping[str, str], log_path: Path) -> Iterator[BentoServer]:
    """``bentoml serve platforms.bentoml.service:Ember`` on a free loopback port.

    Yields as soon as the port answers HTTP (not when models are ready, so a test can
    watch readiness change); the whole process group is ended afterwards.
    """
    port = free_port()
    args = [
        str(BENTOML),
        "serve",
        "platforms.bentoml.service:Ember",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    process = support.spawn(args, env, log_path)
    server = BentoServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        # Answering at all is enough: the test watches readiness change itself.
        wait_ready(server.url, process, log_path, "/livez", 120, accept=lambda _: True)
        yield server
    finally:
        stop_process(process)
