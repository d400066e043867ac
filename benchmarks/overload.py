"""Overload and hostile-client checks against an Ember server, with the figures they give.

    .venv/bin/python benchmarks/overload.py --launch                 # start `ember serve` here
    .venv/bin/python benchmarks/overload.py --url http://127.0.0.1:7997 --api-key KEY

Each check is bounded in count and time and prints one line:
- flood: unloaded throughput (4 clients), then ``--clients`` clients looping on requests of
  ``--texts`` texts for ``--seconds`` (backing off ``--backoff`` s after a 429, as
  ``Retry-After`` asks): goodput as a share of unloaded, 429 latency p50/p99, 504 count;
- idle sockets: ``--idle`` connections that never send a byte, how many are open after
  ``--idle-wait`` s;
- slow headers: one byte a second; when the server cut it (or that it did not within the cap);
- short body: ``Content-Length: 10`` and 3 bytes; what came back, and when;
- disconnects: requests dropped by their clients mid-wait; the server's queue-depth gauge once
  it drains (polled, at most 60 s) and how long that took;
- SIGTERM under load (``--launch`` only): requests in flight when the signal came, how many
  were answered and completed, the statuses they got (503 for any the 10 s graceful
  shutdown cut off), and the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

REPO = Path(__file__).resolve().parents[1]
TEXT = "A sentence of ordinary length for the load, about retrieval and ranking."


def _pct_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


class RawClient:
    """One keep-alive HTTP/1.1 connection sending one prepared request, over asyncio
    streams: a few microseconds of client work per request, where httpx spends about a
    millisecond, so that on a small machine the latency measured is the server's and not
    the load generator's own event loop (all clients share it)."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self.host, self.port, self.request = host, port, request
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def connect(self) -> None:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)

    async def send(self, request: bytes | None = None) -> int:
        """Send ``request`` (default: the prepared one); its status, once fully read."""
        await self.connect()
        assert self.streams is not None
        reader, writer = self.streams
        try:
            writer.write(request or self.request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            await reader.readexactly(length)
            if b"connection: close" in head.lower():
                self.close()
            return status
        except (OSError, asyncio.IncompleteReadError):
            self.close()
            raise

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None


def _prepared(host: str, port: int, headers: dict, body: bytes) -> bytes:
    lines = [
        "POST /v1/embeddings HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def flood(url: str, headers: dict, args: argparse.Namespace) -> dict:
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    body = json.dumps({"input": [TEXT] * args.texts}).encode()
    request = _prepared(host, port, headers, body)

    health = f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()

    async def connected(count: int) -> list[RawClient]:
        """``count`` clients on open connections that the server has accepted and answered
        once (a /health each), so that the clock starts on warm connections: a request's
        latency runs from its write. Measured before this, the first burst after 200
        simultaneous connects took up to 35 ms, the server still accepting the rest."""
        clients = [RawClient(host, port, request) for _ in range(count)]
        await asyncio.gather(*(client.send(health) for client in clients))
        return clients

    async def loop(client: RawClient, stop: float, out: dict) -> None:
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                try:
                    status = await client.send()
                except (OSError, asyncio.IncompleteReadError):
                    out["errors"] = out.get("errors", 0) + 1
                    continue
                took = time.perf_counter() - t0
                out[status] = out.get(status, 0) + 1
                if status == 429:
                    out.setdefault("429s", []).append(took)
                    await asyncio.sleep(args.backoff)
        finally:
            client.close()

    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
        unloaded: dict = {}
        clients = await connected(4)
        t0 = time.perf_counter()
        await asyncio.gather(*(loop(client, t0 + args.seconds, unloaded) for client in clients))
        base = unloaded.get(200, 0) * args.texts / (time.perf_counter() - t0)
        flooded: dict = {}
        before = await _server_seconds(c, "429")
        clients = await connected(args.clients)
        t0 = time.perf_counter()
        await asyncio.gather(*(loop(client, t0 + args.seconds, flooded) for client in clients))
        good = flooded.get(200, 0) * args.texts / (time.perf_counter() - t0)
        after = await _server_seconds(c, "429")
    refused = flooded.get("429s", [])
    server_side = {le: after.get(le, 0) - before.get(le, 0) for le in after}
    return {
        "unloaded_texts_per_s": round(base, 1),
        "goodput_texts_per_s": round(good, 1),
        "goodput_share": round(good / base, 2) if base else None,
        "ok": flooded.get(200, 0),
        "429": len(refused),
        "429_p50_ms": _pct_ms(refused, 0.5),
        "429_p99_ms": _pct_ms(refused, 0.99),
        "504": flooded.get(504, 0),
        "connection_errors": flooded.get("errors", 0),
        # the server's own view (ember_request_seconds): the bucket holding the quantile
        "429_server_p50_ms_le": _bucket_quantile(server_side, 0.5),
        "429_server_p99_ms_le": _bucket_quantile(server_side, 0.99),
    }


async def _server_seconds(client: httpx.AsyncClient, status: str) -> dict[float, float]:
    """Cumulative bucket counts of /v1/embeddings answers with ``status``, by upper bound."""
    from prometheus_client.parser import text_string_to_metric_families

    text = (await client.get("/metrics")).text
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "ember_request_seconds":
            continue
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name.endswith("_bucket")
                and labels.get("route") == "/v1/embeddings"
                and labels.get("status") == status
            ):
                buckets[float(labels["le"])] = sample.value
    return buckets


def _bucket_quantile(cumulative: dict[float, float], q: float) -> float | None:
    """The upper bound (ms) of the bucket where the ``q`` quantile falls."""
    total = cumulative.get(float("inf"), 0)
    if not total:
        return None
    for bound in sorted(cumulative):
        if cumulative[bound] >= q * total:
            return bound * 1000
    return None


def _connect(host: str, port: int) -> socket.socket:
    return socket.create_connection((host, port), timeout=5)


def _is_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""  # data waiting: still open
    except BlockingIOError:
        return True  # nothing to read and no EOF
    except OSError:
        return False


def idle_sockets(host: str, port: int, count: int, wait: float) -> dict:
    socks = []
    try:
        for _ in range(count):
            try:
                socks.append(_connect(host, port))
            except OSError:
                break
        time.sleep(wait)
        still = sum(_is_open(s) for s in socks)
    finally:
        for s in socks:
            s.close()
    return {"opened": len(socks), "open_after_s": wait, "still_open": still}


def slow_headers(host: str, port: int, cap: float) -> dict:
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\nX-Slow: {'a' * 200}\r\n\r\n".encode()
    sock = _connect(host, port)
    started = time.perf_counter()
    try:
        for byte in request:
            if time.perf_counter() - started > cap:
                return {"cut_after_s": None, "note": f"still open after {cap:g}s"}
            sock.sendall(bytes([byte]))
            time.sleep(1.0)
            if not _is_open(sock):
                return {"cut_after_s": round(time.perf_counter() - started, 1)}
            sock.setblocking(True)
    except OSError:
        return {"cut_after_s": round(time.perf_counter() - started, 1)}
    finally:
        sock.close()
    return {"cut_after_s": None, "note": "the whole request went through"}


def short_body(host: str, port: int, headers: dict, cap: float) -> dict:
    auth = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head = (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: {host}\r\n{auth}"
        "Content-Type: application/json\r\nContent-Length: 10\r\n\r\n"
    )
    sock = _connect(host, port)
    sock.settimeout(cap)
    started = time.perf_counter()
    try:
        sock.sendall(head.encode() + b'{"i')
        answer = sock.recv(200)
    except TimeoutError:
        return {"answer": None, "note": f"no answer within {cap:g}s"}
    finally:
        sock.close()
    status = answer.split(b"\r\n", 1)[0].decode(errors="replace") if answer else "closed"
    return {"answer": status, "after_s": round(time.perf_counter() - started, 2)}


async def disconnects(url: str, headers: dict, count: int, drain_cap: float = 60.0) -> dict:
    body = {"input": [TEXT] * 32}

    async def dropped() -> None:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=0.05) as c:
            try:
                await c.post("/v1/embeddings", json=body)
            except httpx.TimeoutException:
                pass  # the client gave up and closed its connection

    await asyncio.gather(*(dropped() for _ in range(count)))
    # The server notices each disconnect and drops its queued inputs at once, but inputs
    # already in a forward pass are counted until it ends: on a busy host that takes a
    # while, so poll (bounded) rather than read the gauge once after a fixed sleep.
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as c:
        while True:
            metrics = (await c.get("/metrics")).text
            depth = [
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("ember_queue_depth{")
            ]
            if not any(depth) or time.perf_counter() - started > drain_cap:
                break
            await asyncio.sleep(0.2)
        healthy = (await c.get("/health")).status_code == 200
    drained = round(time.perf_counter() - started, 2)
    return {"dropped": count, "queue_depth_after": depth, "drained_s": drained, "healthy": healthy}


async def sigterm_under_load(url: str, headers: dict, process: subprocess.Popen) -> dict:
    body = {"input": [TEXT] * 16}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as c:
        tasks = [asyncio.ensure_future(c.post("/v1/embeddings", json=body)) for _ in range(16)]
        await asyncio.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        results = await asyncio.gather(*tasks, return_exceptions=True)
    ok = sum(not isinstance(r, Exception) and r.status_code == 200 for r in results)
    # an answer of any status (a 504 past --request-timeout too), not a dropped connection
    answered = sum(not isinstance(r, Exception) for r in results)
    statuses: dict[str, int] = {}
    for r in results:
        key = type(r).__name__ if isinstance(r, Exception) else str(r.status_code)
        statuses[key] = statuses.get(key, 0) + 1
    code = await asyncio.to_thread(process.wait, 30)
    return {
        "in_flight": len(tasks),
        "answered": answered,
        "completed": ok,
        "statuses": statuses,
        "exit_code": code,
    }


def launch(args: argparse.Namespace) -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "ember", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--request-timeout", str(args.request_timeout), *args.serve_args]
    env = {**os.environ, "PYTHONPATH": str(REPO / "core"), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"ember serve exited with {process.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return url, process
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    process.kill()
    raise SystemExit("ember serve was not ready within 240 s")


def say(check: str, figures: dict) -> None:
    """One line per check: its name, then its figures as JSON."""
    print(check, json.dumps(figures), flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=None, help="a running server (default: --launch)")
    parser.add_argument("--launch", action="store_true", help="start `ember serve` here")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--texts", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--backoff", type=float, default=0.5)
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--idle-wait", type=float, default=15.0)
    parser.add_argument("--slow-cap", type=float, default=20.0)
    parser.add_argument("--request-timeout", type=float, default=1.0, help="with --launch")
    parser.add_argument(
        "--only", choices=("flood",), default=None, help="run this check alone (e.g. for A/B runs)"
    )
    parser.add_argument("serve_args", nargs="*", help="more `ember serve` flags (--launch)")
    args = parser.parse_args()
    process = None
    url = args.url
    if args.launch or not url:
        started = time.perf_counter()
        url, process = launch(args)
        say("ready", {"url": url, "after_s": round(time.perf_counter() - started, 1)})
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    try:
        say("flood", await flood(url, headers, args))
        if args.only == "flood":
            return
        say("idle sockets", idle_sockets(host, port, args.idle, args.idle_wait))
        say("slow headers", slow_headers(host, port, args.slow_cap))
        say("short body", short_body(host, port, headers, args.slow_cap))
        say("disconnects", await disconnects(url, headers, 20))
        if process is not None:
            say("sigterm", await sigterm_under_load(url, headers, process))
    finally:
        if process is not None and process.poll() is None:
            process.kill()


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    """On uvloop where it is installed (uvicorn[standard] brings it): it spends about a
    third less of the load generator's CPU per request than asyncio's own loop, CPU that
    on a small machine is taken from the server under test."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coroutine)
    else:
        uvloop.run(coroutine)


if __name__ == "__main__":
    run(main())
