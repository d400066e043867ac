"""Helpers for the Modal and BentoML adapter tests.

The BentoML test runs the real ``bentoml serve`` as a subprocess on 127.0.0.1, in its
own process group so every worker it forks is ended with it; the Modal tests run the
app's class locally (``.local()``) and need no Modal account. Both compare what the
adapter returns with what the core's own engines return for the same models.
"""

from __future__ import annotations

import ast
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support import free_port, stop_process

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
    """This environment without any EMBER_*/MODAL_* settings, plus the core on the path.

    A clean EMBER_* slate makes the child serve exactly the models the test names; HOME
    points at an empty directory so no Modal or BentoML config of the developer leaks in.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EMBER_", "MODAL_"))}
    paths = [str(REPO / "core"), str(REPO)]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        HOME=str(home),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        BENTOML_HOME=str(home / "bentoml"),
        BENTOML_DO_NOT_TRACK="true",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


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
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            args,
            cwd=REPO,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = BentoServer(f"http://127.0.0.1:{port}", process, log_path)
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise AssertionError(
                    f"bentoml serve exited with {process.returncode}:\n{server.log()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(server.url + "/livez", timeout=2)
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"bentoml serve did not answer in 120 s:\n{server.log()}")
            time.sleep(0.25)
        yield server
    finally:
        stop_process(process)
