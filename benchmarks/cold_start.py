"""Cold start, measured: process (or container) start -> ready -> first answer, split into
imports, model load and warm-up, for ``ember serve`` from a venv and for an image.

    python benchmarks/cold_start.py --ember .venv/bin/ember --starts 3
    python benchmarks/cold_start.py --image localhost/ember:cpu --starts 3
    python benchmarks/cold_start.py --importtime .venv/bin/python   # import time per top module

Each start is timed from the moment the process (``podman run``) is launched: for an image,
"container" to the container's process start (podman's ``State.StartedAt``: the runtime's
share, which no change to the image moves), then "imports" from there (from the launch, for
a venv) to uvicorn's "Started server process" line (Python, Ember, FastAPI and uvicorn
imported, the app built), "load" and "warm-up" from the engine's ``ready`` line (the
backend's load, the near-exact decision included, and the warm-up batches), "ready" to the
first 200 on /ready, "first answer" to the first /v1/embeddings reply. The first model's load
begins before the HTTP stack is imported and runs beside it (``EngineArray.begin_first_load``),
so "load" overlaps "imports" and the parts add up to more than "ready". A venv's first start
(graph built) is reported apart from the later ones (graph cached). Figures go to
benchmarks/results/, not to asserts: they are this host's.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

READY = re.compile(r"ready: .* load=([\d.]+)s warm-up=([\d.]+)s")
STARTED = "Started server process"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})")


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stamp(line: str) -> float | None:
    match = STAMP.match(line)
    if not match:
        return None
    return datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _container_started(podman: str, name: str) -> float | None:
    """When the runtime started the container's process (epoch seconds), as podman saw it."""
    done = subprocess.run(
        [podman, "inspect", "--format", "{{.State.StartedAt.UnixNano}}", name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    text = done.stdout.strip()
    return int(text) / 1e9 if done.returncode == 0 and text.isdigit() else None


def one_start(
    command: list[str], url: str, log: Path, stop: list[str] | None, container: str | None = None
) -> dict[str, float]:
    """Launch ``command``, poll until ready, send one request; the split in seconds (for a
    container, "container" is the launch to its process's start and "imports" from there)."""
    launched_wall = time.time()
    launched = time.monotonic()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"exited {process.returncode}: {log.read_text()[-3000:]}")
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        ready = time.monotonic() - launched
        answer = httpx.post(url + "/v1/embeddings", json={"input": ["hello"]}, timeout=60)
        answer.raise_for_status()
        first = time.monotonic() - launched
        began = _container_started(stop[0], container) if stop and container else None
    finally:
        if stop:
            subprocess.run(stop, capture_output=True, timeout=60)
        process.terminate()
        process.wait(timeout=60)
    text = log.read_text(errors="replace")
    started = next((_stamp(line) for line in text.splitlines() if STARTED in line), None)
    loads = READY.findall(text)
    split = {"container": began - launched_wall} if began else {}
    origin = began or launched_wall
    return {
        **split,
        "imports": (started - origin) if started else float("nan"),
        "load": sum(float(load) for load, _ in loads),
        "warm-up": sum(float(warm) for _, warm in loads),
        "ready": ready,
        "first answer": first,
    }


def import_times(python: str, modules: str) -> list[tuple[str, float]]:
    """``python -X importtime``: seconds per top-level package (the self time of each of its
    modules, wherever imported from, summed), largest first."""
    done = subprocess.run(
        [python, "-X", "importtime", "-c", f"import {modules}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    totals: dict[str, float] = {}
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].split(":")[-1].strip().isdigit():
            continue
        top = parts[2].strip().split(".")[0]
        totals[top] = totals.get(top, 0.0) + int(parts[0].split(":")[-1]) / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--ember", help="an `ember` executable (a venv's)")
    what.add_argument("--image", help="an image tag, run with podman")
    what.add_argument("--importtime", metavar="PYTHON", help="import time per top module")
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--model-id", default="")
    parser.add_argument(
        "--modules",
        default="ember.cli, ember.api.app, uvicorn, ember.backends.onnx_backend, onnxruntime, "
        "openvino",
        help="what --importtime imports (the onnx path's modules)",
    )
    args = parser.parse_args()
    if args.importtime:
        rows = import_times(args.importtime, args.modules)
        total = sum(seconds for _, seconds in rows)
        print(f"imports: {total:.2f} s in all")
        for name, seconds in rows[:12]:
            print(f"  {name:<24} {seconds:6.3f} s")
        return 0
    rows = []
    cache = Path(tempfile.mkdtemp(prefix="ember-cold-"))
    try:
        for n in range(args.starts):
            port = _port()
            url = f"http://127.0.0.1:{port}"
            stop = None
            if args.image:
                name = f"ember-cold-{port}"
                podman = shutil.which("podman") or "podman"
                command = [podman, "run", "--rm", "--name", name, "-p", f"{port}:7997",
                           "--read-only", "--tmpfs", "/tmp", args.image]  # fmt: skip
                stop = [podman, "stop", "-t", "30", name]
            else:
                command = [args.ember, "serve", "--host", "127.0.0.1", "--port", str(port),
                           "--cache-dir", str(cache)]  # fmt: skip
                if args.model_id:
                    command += ["--model-id", args.model_id]
            container = name if args.image else None
            split = one_start(command, url, cache / f"start-{n}.log", stop, container)
            rows.append(split)
            print(f"start {n + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in split.items()))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    later = rows[1:] if args.ember and len(rows) > 1 else rows
    print("median of " + ("later starts" if later is not rows else "starts") + ": " + ", ".join(
        f"{k} {statistics.median(r[k] for r in later):.2f} s" for k in rows[0]
    ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
