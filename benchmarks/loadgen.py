"""Server-agnostic async load generator for embedding/rerank HTTP servers.

Why its own module: the same loads must hit Ember, Infinity and anything else speaking the
OpenAI embeddings / Cohere rerank JSON, so nothing here knows about a particular server
beyond the route paths it is given. Every load is bounded in request count *and* wall
time, and only loopback addresses are accepted (this harness must never send traffic
anywhere else).

The client is aiohttp with bodies serialised before the clock starts: client and server
share this machine's cores, and httpx spent 2.2 ms of CPU per request against aiohttp's
0.3-1.0 ms, CPU every server under test lost alike.
"""

from __future__ import annotations

import asyncio
import ipaddress
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson

LOOPBACK_NAMES = {"localhost"}
JSON_HEADERS = {"content-type": "application/json"}
# aiohttp raises its own errors, and asyncio's for a timeout.
CLIENT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError)


def check_loopback(base_url: str) -> None:
    """Refuse anything but 127.0.0.0/8, ::1 or localhost."""
    host = urlsplit(base_url).hostname or ""
    if host in LOOPBACK_NAMES:
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise ValueError(f"load generator only targets loopback addresses, not {host!r}")


@dataclass(frozen=True)
class Request:
    """One HTTP request of a load, with what it is worth when it succeeds."""

    path: str
    body: dict[str, Any]
    items: int  # sentences (embed) or documents (rerank) in the request
    tokens: int  # tokens those items hold (for tokens/s)
    expect: str = "embed"  # "embed" | "rerank": how to validate the response
    flops: float = 0.0  # model FLOPs the request is worth (for achieved-fraction figures)


@dataclass
class LoadResult:
    """Statistics of one load; latencies are of successful requests only."""

    name: str
    concurrency: int
    planned: int
    sent: int = 0
    ok: int = 0
    errors: int = 0
    items: int = 0
    tokens: int = 0
    flops: float = 0.0
    wall_s: float = 0.0
    timed_out: bool = False
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    error_samples: list[str] = field(default_factory=list)

    @property
    def items_per_s(self) -> float:
        return self.items / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def latency_ms(self, q: float) -> float:
        return percentile(self.latencies_ms, q)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly figures (the raw latencies are left out)."""
        out = asdict(self)
        out.pop("latencies_ms")
        out.update(
            items_per_s=round(self.items_per_s, 2),
            tokens_per_s=round(self.tokens_per_s, 1),
            p50_ms=round(self.latency_ms(50), 2),
            p90_ms=round(self.latency_ms(90), 2),
            p99_ms=round(self.latency_ms(99), 2),
            mean_ms=round(sum(self.latencies_ms) / len(self.latencies_ms), 2)
            if self.latencies_ms
            else math.nan,
        )
        return out


def merge_results(parts: Sequence[LoadResult]) -> LoadResult:
    """One result from the slices of an interleaved load: sums, and all latencies."""
    if not parts:
        raise ValueError("nothing to merge")
    out = LoadResult(name=parts[0].name, concurrency=parts[0].concurrency, planned=0)
    for p in parts:
        out.planned += p.planned
        out.sent += p.sent
        out.ok += p.ok
        out.errors += p.errors
        out.items += p.items
        out.tokens += p.tokens
        out.flops += p.flops
        out.wall_s += p.wall_s
        out.timed_out = out.timed_out or p.timed_out
        out.latencies_ms.extend(p.latencies_ms)
        out.error_samples.extend(p.error_samples[: max(0, 5 - len(out.error_samples))])
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _validate(req: Request, payload: Any) -> str | None:
    """Why a 200 response is still wrong, or None: counts must match what was sent."""
    try:
        if req.expect == "embed":
            data = payload["data"]
            if len(data) != req.items or not data[0]["embedding"]:
                return f"expected {req.items} embeddings, got {len(data)}"
        else:
            results = payload["results"]
            if len(results) != req.items:
                return f"expected {req.items} rerank results, got {len(results)}"
            float(results[0]["relevance_score"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return f"malformed response: {type(exc).__name__}: {exc}"
    return None


async def run_load(
    base_url: str,
    requests: Sequence[Request],
    *,
    name: str,
    concurrency: int,
    time_limit_s: float = 120.0,
    warmup: Sequence[Request] = (),
    request_timeout_s: float = 60.0,
    headers: dict[str, str] | None = None,
    cycle: bool = False,
) -> LoadResult:
    """Send ``requests`` with ``concurrency`` in flight; stop early at ``time_limit_s``.

    Warm-up requests go first, one at a time, and are not counted. Throughput is items
    (and tokens) of successful requests over the wall time of the measured phase.
    ``cycle``: send ``requests`` round and round until ``time_limit_s`` (a load held for a
    time, from a few distinct bodies serialised once).
    """
    check_loopback(base_url)
    result = LoadResult(name=name, concurrency=concurrency, planned=len(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    async with aiohttp.ClientSession(
        base_url, connector=connector, timeout=timeout, headers=headers, trust_env=False
    ) as client:

        async def post(req: Request, body: bytes) -> tuple[int, bytes]:
            async with client.post(req.path, data=body, headers=JSON_HEADERS) as resp:
                return resp.status, await resp.read()

        for req in warmup:
            try:
                await post(req, orjson.dumps(req.body))
            except CLIENT_ERRORS:
                pass  # a broken server shows up in the measured phase

        # Bodies are serialised before the clock starts: only the servers' work is timed.
        queue: asyncio.Queue[tuple[Request, bytes]] = asyncio.Queue()
        for req in requests:
            queue.put_nowait((req, orjson.dumps(req.body)))
        start = time.perf_counter()
        deadline = start + time_limit_s

        def record_error(message: str) -> None:
            result.errors += 1
            if len(result.error_samples) < 5:
                result.error_samples.append(message[:300])

        async def worker() -> None:
            while True:
                if time.perf_counter() >= deadline:
                    result.timed_out = result.timed_out or not queue.empty()
                    return
                try:
                    req, body = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if cycle:
                    queue.put_nowait((req, body))
                result.sent += 1
                t0 = time.perf_counter()
                try:
                    status, content = await post(req, body)
                except CLIENT_ERRORS as exc:
                    record_error(f"{type(exc).__name__}: {exc}")
                    continue
                elapsed_ms = (time.perf_counter() - t0) * 1000.0
                if status != 200:
                    record_error(f"HTTP {status}: {content[:200].decode(errors='replace')}")
                    continue
                try:
                    payload = orjson.loads(content)
                except orjson.JSONDecodeError as exc:
                    record_error(f"response is not JSON: {exc}")
                    continue
                problem = _validate(req, payload)
                if problem:
                    record_error(problem)
                    continue
                result.ok += 1
                result.items += req.items
                result.tokens += req.tokens
                result.flops += req.flops
                result.latencies_ms.append(elapsed_ms)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_s = time.perf_counter() - start
    return result


# --- request builders: the four standard loads -------------------------------------------


def embed_requests(
    texts: Sequence[str],
    tokens: Sequence[int],
    per_request: int,
    *,
    path: str,
    model: str,
    flops: Sequence[float] | None = None,
) -> list[Request]:
    """Chunk ``texts`` into OpenAI embedding requests of ``per_request`` inputs each."""
    out: list[Request] = []
    for i in range(0, len(texts), per_request):
        chunk = list(texts[i : i + per_request])
        body = {"model": model, "input": chunk, "encoding_format": "float"}
        work = float(sum(flops[i : i + per_request])) if flops is not None else 0.0
        out.append(
            Request(path, body, len(chunk), int(sum(tokens[i : i + per_request])), "embed", work)
        )
    return out


def rerank_requests(
    query: str,
    docs: Sequence[str],
    tokens: int,
    count: int,
    *,
    path: str,
    model: str,
    flops: float = 0.0,
) -> list[Request]:
    """``count`` identical Cohere-style rerank requests (1 query x len(docs) documents)."""
    body = {"model": model, "query": query, "documents": list(docs), "return_documents": False}
    return [Request(path, body, len(docs), tokens, "rerank", flops) for _ in range(count)]


@dataclass(frozen=True)
class LoadSpec:
    """A named load: how requests are built and how many run at once."""

    name: str
    concurrency: int
    description: str


STANDARD_LOADS: dict[str, LoadSpec] = {
    "a": LoadSpec("a", 4, "32 sentences/request, concurrency 4, whole corpus"),
    "b": LoadSpec("b", 32, "1 sentence/request, concurrency 32, whole corpus"),
    "c": LoadSpec("c", 1, "1 short sentence/request, concurrency 1 (latency)"),
    "d": LoadSpec("d", 1, "rerank 1 query x 32 documents, concurrency 1"),
}


async def fetch_embeddings(
    base_url: str, texts: Sequence[str], *, path: str, model: str, timeout_s: float = 60.0
) -> list[list[float]]:
    """Embeddings for ``texts`` in one request (used for the cosine check)."""
    check_loopback(base_url)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout_s, trust_env=False) as c:
        resp = await c.post(path, json={"model": model, "input": list(texts)})
        resp.raise_for_status()
        data = sorted(resp.json()["data"], key=lambda d: d["index"])
        return [d["embedding"] for d in data]
