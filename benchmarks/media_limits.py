"""Peak memory of hostile media and long inputs, one request at a time, and text latency
beside a media flood: the figures behind the README's bound (issue 22).

    PYTHONPATH=. .venv/bin/python benchmarks/media_limits.py
    PYTHONPATH=. .venv/bin/python benchmarks/media_limits.py --core /tmp/main/core  # "before"

Launches `ember serve` (a tiny CLIP as ``clip`` and the packaged MiniLM as ``text``, on
torch, ``--allow-private-urls``, ``--request-timeout`` 10) from ``--core`` (default: this
checkout's), under an address-space cap (``--memory-cap-gb``) so that a server without the
bounds fails alone instead of taking the machine; and a local HTTP server for the URLs.
Each case is sent alone, after the server's peak RSS is reset (``/proc/PID/clear_refs``),
and prints one line: status, seconds, and the peak RSS above the idle server (MiB). A
server that died is started again for the next case. Then ``--flood-seconds`` of text
requests (2 clients, one short text each) unloaded and beside ``--flood-clients`` clients
sending 8 images each: p50 and p99 in ms. Every loop is bounded in count and time.

Cases: ``png-4000000x10`` (a 5 KB PNG), ``webp-6000-rgba`` (one 6000 x 6000 RGBA WebP of
1.4 KB) and ``webp-6000-rgba-x12`` (twelve in one request), ``jpeg-3000-scans`` (a flat
2000 x 2000 progressive JPEG, its last scan repeated 3,000 times: 66 KB), ``urls-20x10mb``
(20 URLs of 10 MB each), ``text-1.95mb`` (one text of 1.95 MB), ``trailers`` (a chunked
body whose trailers never end, sent until the server closes or 64 MB went).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fixtures.media_models import build_tiny_clip  # noqa: E402
from tests.fixtures.media_server import media_server  # noqa: E402

TEXT = "A sentence of ordinary length for the load, about retrieval and ranking."
TEN_MB = 10_000_000
TRAILER_CAP = 64 * 1024 * 1024


def _encode(image: object, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)  # type: ignore[attr-defined]
    return out.getvalue()


def _uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def hostile_images() -> dict[str, str]:
    from PIL import Image

    png = _encode(Image.new("1", (4_000_000, 10)), "PNG")
    webp = _encode(Image.new("RGBA", (6000, 6000)), "WEBP", lossless=True)
    # Each scan is a pass over every block, however few bytes it holds: the last scan of a
    # flat 2000 x 2000 image is 14 bytes, and 3,000 of them cost ~28 s to decode (66 KB).
    jpeg = _encode(Image.new("RGB", (2000, 2000), (90, 20, 200)), "JPEG", progressive=True)
    last, end = jpeg.rindex(b"\xff\xda"), jpeg.rindex(b"\xff\xd9")
    scans = jpeg[:end] + jpeg[last:end] * 3000 + jpeg[end:]
    return {
        "png": _uri(png, "image/png"),
        "webp": _uri(webp, "image/webp"),
        "jpeg": _uri(scans, "image/jpeg"),
    }


class Server:
    """`ember serve` from ``core``, its memory read from /proc."""

    def __init__(self, core: Path, clip: Path, cap_gb: float, log: Path) -> None:
        self.core, self.clip, self.cap_gb, self.log = core, clip, cap_gb, log
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        from ember.models.resolve import default_model_path

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "ember", "serve", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--model-id", f"{self.clip};{default_model_path()}"]
        cmd += ["--served-model-name", "clip;text", "--backend", "torch"]
        cmd += ["--allow-private-urls", "--request-timeout", "10"]
        env = {**os.environ, "PYTHONPATH": str(self.core), "HF_HUB_OFFLINE": "1"}
        cap = int(self.cap_gb * 2**30)

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

        with self.log.open("ab") as log:
            self.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, preexec_fn=limit)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"ember serve exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise SystemExit("ember serve was not ready within 300 s")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def _status(self) -> dict[str, int]:
        assert self.process is not None
        fields = {}
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                fields[name] = int(value.split()[0])  # kB
        return fields

    def measure(self, send: Callable[[Server], object]) -> dict:
        """``send`` alone, its status, seconds and the peak RSS above idle (MiB)."""
        if not self.alive():
            self.start()
        assert self.process is not None
        Path(f"/proc/{self.process.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        idle = self._status()["VmRSS"]
        t0 = time.perf_counter()
        try:
            status = send(self)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        seconds = round(time.perf_counter() - t0, 2)
        if not self.alive():
            return {"status": status, "s": seconds, "server": f"died ({self.process.returncode})"}
        peak = self._status()["VmHWM"]
        return {"status": status, "s": seconds, "peak_mib": round((peak - idle) / 1024)}


def embed(model: str, inputs: list[str], modality: str = "text") -> Callable[[Server], object]:
    def send(server: Server) -> object:
        body = {"model": model, "input": inputs, "modality": modality}
        response = httpx.post(server.url + "/v1/embeddings", json=body, timeout=120)
        return response.status_code

    return send


def endless_trailers(server: Server) -> object:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/embeddings HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\n[1,2]\r\n0\r\n"
        )
        line = b"X-Trailer: " + b"a" * 8000 + b"\r\n"
        sent, deadline = 0, time.monotonic() + 60
        try:
            while sent < TRAILER_CAP and time.monotonic() < deadline:
                sock.sendall(line)
                sent += len(line)
        except OSError:
            pass
        try:
            head = sock.recv(200)
        except OSError:
            head = b""
    status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/") else "closed"
    return f"{status} after {sent / 2**20:.1f} MiB"


async def text_latency(url: str, seconds: float, flood: list[str] | None, clients: int) -> dict:
    """Text p50/p99 (2 clients) for ``seconds``, beside ``clients`` image flooders if given."""
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    stop = time.monotonic() + seconds

    async def text(client: httpx.AsyncClient) -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            r = await client.post("/v1/embeddings", json={"model": "text", "input": [TEXT]})
            latencies.append(time.perf_counter() - t0)
            statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1

    async def images(client: httpx.AsyncClient) -> None:
        body = {"model": "clip", "input": flood, "modality": "image"}
        while time.monotonic() < stop:
            r = await client.post("/v1/embeddings", json=body)
            key = f"media {r.status_code}"
            statuses[key] = statuses.get(key, 0) + 1

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        jobs = [text(client) for _ in range(2)]
        if flood:
            jobs += [images(client) for _ in range(clients)]
        await asyncio.gather(*jobs)
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

    return {"requests": len(ordered), "p50_ms": pct(0.5), "p99_ms": pct(0.99), **statuses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--core", type=Path, default=REPO / "core", help="ember to serve")
    parser.add_argument("--memory-cap-gb", type=float, default=12.0)
    parser.add_argument("--cases", default="all", help="comma-separated case names")
    parser.add_argument("--flood-seconds", type=float, default=10.0)
    parser.add_argument("--flood-clients", type=int, default=4)
    args = parser.parse_args()

    from PIL import Image

    images = hostile_images()
    ordinary = _uri(_encode(Image.new("RGB", (640, 480), (30, 120, 200)), "JPEG"), "image/jpeg")
    work = Path(tempfile.mkdtemp(prefix="ember-media-limits-"))
    clip = build_tiny_clip(work / "clip")
    served = {"/10mb.png": ("image/png", os.urandom(TEN_MB))}
    with media_server(served) as files:
        cases: dict[str, Callable[[Server], object]] = {
            "text-1.95mb": embed("text", [("word " * 400_000)[:1_950_000]]),
            "urls-20x10mb": embed("clip", [f"{files.url}/10mb.png"] * 20, "image"),
            "trailers": endless_trailers,
            "jpeg-3000-scans": embed("clip", [images["jpeg"]], "image"),
            "webp-6000-rgba": embed("clip", [images["webp"]], "image"),
            "webp-6000-rgba-x12": embed("clip", [images["webp"]] * 12, "image"),
            "png-4000000x10": embed("clip", [images["png"]], "image"),
        }
        chosen = list(cases) if args.cases == "all" else args.cases.split(",")
        server = Server(args.core, clip, args.memory_cap_gb, work / "serve.log")
        server.start()
        try:
            print("core", json.dumps({"core": str(args.core)}), flush=True)
            for name in chosen:
                print(name, json.dumps(server.measure(cases[name])), flush=True)
            if args.flood_seconds > 0:
                if not server.alive():
                    server.start()
                unloaded = asyncio.run(text_latency(server.url, args.flood_seconds, None, 0))
                print("text-unloaded", json.dumps(unloaded), flush=True)
                flood = [ordinary] * 8
                loaded = asyncio.run(
                    text_latency(server.url, args.flood_seconds, flood, args.flood_clients)
                )
                print("text-beside-media-flood", json.dumps(loaded), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
