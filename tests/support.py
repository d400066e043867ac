"""Helpers for tests that run real servers on 127.0.0.1 (bounded in time)."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def chromium() -> str | None:
    """Debian's headless-capable browser, where installed (``.ci/run`` installs it)."""
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)


def offline_chromium_argv(profile: Path) -> list[str]:
    """Headless Chromium with every host but 127.0.0.1 unresolvable and any proxying sent
    to a dead port; the caller adds what to do and the page."""
    browser = chromium()
    assert browser is not None, "needs chromium: apt-get install -y chromium"
    return [
        browser,
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--proxy-server=http://127.0.0.1:9",
        "--proxy-bypass-list=127.0.0.1",
    ]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen
    log_path: Path
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60, **kwargs)


def child_env(
    extra: Mapping[str, str] | None = None, *, drop_prefixes: tuple[str, ...] = ()
) -> dict[str, str]:
    """This environment with the core importable and Hugging Face offline, plus extras.

    ``drop_prefixes`` removes inherited settings (e.g. ``EMBER_``) so a child serves
    exactly what the test names.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop_prefixes or ("\0",))}
    paths = [str(REPO / "core"), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


def run_python(*args: str, timeout: float = 600) -> list[str]:
    """``python *args`` in a child of its own (no inherited ``EMBER_*`` settings), which
    must exit 0; its standard output's lines."""
    child = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=child_env(drop_prefixes=("EMBER_",)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return child.stdout.strip().splitlines()


def spawn(cmd: list[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen:
    """Start ``cmd`` in its own process group (so ``stop_process`` ends all it forks)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(
    url: str,
    process: subprocess.Popen,
    log_path: Path,
    path: str = "/ready",
    timeout: float = 240.0,
    accept: Callable[[int], bool] = lambda status: status == 200,
) -> None:
    """Poll ``url + path`` until ``accept(status)``; fail early if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{log_path.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if accept(httpx.get(url + path, timeout=2).status_code):
                return
        time.sleep(0.25)
    raise TimeoutError(f"{url}{path} not ready after {timeout}s:\n{log_path.read_text()}")


def stop_process(process: subprocess.Popen, timeout: float = 20) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextlib.contextmanager
def start_server(
    args: list[str], *, api_key: str | None = None, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    """Run `python -m ember serve ARGS` on a free loopback port until the block ends.

    ``EMBER_TEST_CPU_EMULATOR`` (e.g. ``qemu-x86_64 -cpu Haswell``) runs the server under
    a CPU-model emulator: how the int8 parity tests are checked for a CPU kind the host is
    not (CPUID, and so ONNX Runtime's kernel choice, are the emulated CPU's)."""
    port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"ember-serve-{port}.log"
    emulator = shlex.split(os.environ.get("EMBER_TEST_CPU_EMULATOR", ""))
    cmd = [
        *emulator,
        sys.executable,
        "-m",
        "ember",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *args,
    ]
    process = spawn(cmd, child_env(env), log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process, log_path, timeout=1800.0 if emulator else 240.0)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        yield ServerProcess(url, process, log_path, api_key, headers)
    finally:
        stop_process(process)


BUSY_LOOP = (
    "import sys, time\nend = time.monotonic() + float(sys.argv[1])\n"
    "print('spinning', flush=True)\nwhile time.monotonic() < end: pass"
)


@contextlib.contextmanager
def busy_cores(count: int | None = None, seconds: float = 120.0) -> Iterator[None]:
    """A host busy with other work, as CI's may be: ``count`` processes (default: one per
    core) spinning at normal priority for at most ``seconds``, stopped when the block ends.
    Tests of admission and draining run inside it, so their outcome cannot hang on the
    host having idle cores."""
    count = count or os.cpu_count() or 1
    spinners = [
        subprocess.Popen(
            [sys.executable, "-c", BUSY_LOOP, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(count)
    ]
    try:
        # Busy before the block runs: a rate measured first thing in it (the admission tests
        # time one request) must be the busy host's, not that of a host still starting its
        # spinners (CI measured 0.06 s there, then 12 of 40 admitted requests expired).
        for spinner in spinners:
            assert spinner.stdout is not None and spinner.stdout.readline() == "spinning\n"
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(timeout=10)


def refused_start(args: list[str], timeout: float = 180.0) -> list[str]:
    """``ember serve ARGS`` as a user starts it (no EMBER_* settings from this run), for
    a model it must refuse: exit 2, no traceback; returns its ``ember: error:`` lines."""
    done = subprocess.run(
        [sys.executable, "-m", "ember", "serve", "--host", "127.0.0.1"]
        + ["--port", str(free_port()), *args],
        cwd=REPO,
        env=child_env(drop_prefixes=("EMBER_",)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("ember: error:")]
