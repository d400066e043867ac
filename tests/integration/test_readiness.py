"""/health is readiness as Infinity, TEI and vLLM mean it; /livez is liveness.

A real ``ember serve`` loads a model whose ``modules.json`` is a FIFO: loading blocks on
it until the test writes the file, so "still loading" lasts exactly as long as the test
wants, with no clock in it. Until then /health is 503 ``{"status": "loading"}`` and /ready
503, while /livez is 200; once the file is written, /health turns 200 with /ready.
A model that fails to load: /health 503 ``{"status": "failed"}``, /livez still 200.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from ember.api.app import create_app
from ember.config import settings_from_env
from tests.support import child_env, free_port, spawn, stop_process, wait_ready

GATED = "modules.json"  # read once, by Python (which lets go of the GIL while it waits)


@contextmanager
def gated_copy(model: Path, tmp: Path) -> Iterator[tuple[Path, threading.Event, threading.Event]]:
    """``model`` linked file by file into ``tmp``, with GATED a FIFO; set the first event
    to hand the first reader the real file and put the real file in the FIFO's place for
    any later one; the second is set once a reader has had it."""
    for source in model.rglob("*"):
        if source.is_file():
            target = tmp / source.relative_to(model)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)
    fifo = tmp / GATED
    fifo.unlink()
    os.mkfifo(fifo)
    real = tmp / f".{GATED}.real"
    real.symlink_to(model / GATED)
    release, served, done = threading.Event(), threading.Event(), threading.Event()

    def serve_reader() -> None:
        release.wait(timeout=600)
        while not done.is_set():
            try:  # non-blocking: without a reader this fails at once, and done is seen
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                if exc.errno != errno.ENXIO:
                    raise
                time.sleep(0.05)
                continue
            os.set_blocking(fd, True)
            with os.fdopen(fd, "wb") as out:
                out.write((model / GATED).read_bytes())
                os.replace(real, fifo)  # before EOF: no later reader finds the FIFO
            served.set()
            return

    writer = threading.Thread(target=serve_reader, daemon=True)
    writer.start()
    try:
        yield tmp, release, served
    finally:
        done.set()
        release.set()
        writer.join(timeout=10)


def _get(url: str) -> httpx.Response:
    return httpx.get(url, timeout=10)


def test_health_waits_for_the_model_and_livez_does_not(minilm_path: Path, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with gated_copy(minilm_path, tmp_path / "model") as (model, release, served):
        argv = ["serve", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--model-id", str(model), "--backend", "torch", "--api-key", "k"]
        log = tmp_path / "serve.log"
        process = spawn(
            [sys.executable, "-m", "ember", *argv],
            child_env(drop_prefixes=("EMBER_", "INFINITY_")),
            log,
        )
        try:
            wait_ready(url, process, log, "/livez", 120)  # listening: alive, not ready
            for _ in range(3):  # the loader waits on the FIFO: nothing can turn ready
                health = _get(url + "/health")
                assert (health.status_code, health.json()) == (503, {"status": "loading"})
                assert _get(url + "/ready").status_code == 503
                assert _get(url + "/livez").json() == {"status": "alive"}
            release.set()
            seen: list[tuple[int, int, int]] = []
            deadline = time.monotonic() + 240
            while not seen or seen[-1][1] != 200:
                assert time.monotonic() < deadline, f"not ready after 240 s: {log.read_text()}"
                # /health first, /ready right after: a 200 from /health with a 503 from
                # /ready after it would be /health saying ready too early.
                seen.append(
                    (
                        _get(url + "/health").status_code,
                        _get(url + "/ready").status_code,
                        _get(url + "/livez").status_code,
                    )
                )
                time.sleep(0.2)
            assert all(live == 200 for _, _, live in seen), seen
            assert all(ready == 200 for health, ready, _ in seen if health == 200), seen
            health = _get(url + "/health")
            assert health.status_code == 200
            assert health.json()["status"] == "ok" and health.json()["unix"] > 0
            assert _get(url + "/livez").status_code == 200
            assert served.is_set()  # loading did wait on the gate
        finally:
            stop_process(process)


def test_a_failed_load_is_failed_on_health_and_alive_on_livez(tmp_path: Path) -> None:
    """Embedded (as BentoML runs the app, with no one to stop the server on failure)."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    app = create_app(settings_from_env(model_id=str(broken), backend="torch"))
    with TestClient(app) as client:
        deadline = time.monotonic() + 60
        while (health := client.get("/health")).json() == {"status": "loading"}:
            assert time.monotonic() < deadline, "the broken model neither loaded nor failed"
            time.sleep(0.05)
        assert (health.status_code, health.json()) == (503, {"status": "failed"})
        ready = client.get("/ready")
        assert ready.status_code == 503 and "model loading failed" in ready.text
        assert client.get("/livez").status_code == 200
