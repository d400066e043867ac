"""Per-key limits under a flood (``--api-keys-file``): one key floods, another sends at its
normal rate; the steady key's latency (p50, p99) alone and while the flood runs, and what
the flood got (200s, 429s).

    PYTHONPATH=core:. .venv/bin/python benchmarks/api_keys.py                 # ~20 s
    PYTHONPATH=core:. .venv/bin/python benchmarks/api_keys.py --flood 2000 --steady 200

One `ember serve` (the packaged MiniLM); the flooding key may send ``--flood-rps`` requests
a second, the steady one sends ``--rate`` a second, one short text each. The flood runs in
a process of its own, so that its client work does not delay the steady client's. Writes
``results/<date>-api-keys.md`` / ``.json``. The integration test
(tests/integration/test_api_keys.py) runs the same two clients, short, and asserts only
counts.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import multiprocessing
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.loadgen import percentile  # noqa: E402

FLOOD_KEY, STEADY_KEY = "sk-bench-flood", "sk-bench-steady"
BODY = {"model": "minilm", "input": ["the quick brown fox"]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def flood(
    client: httpx.AsyncClient, key: str, requests: int, concurrency: int, seconds: float
) -> Counter[int]:
    """``requests`` embeddings as fast as ``concurrency`` workers get answers (stopping
    after ``seconds``): the statuses seen."""
    statuses: Counter[int] = Counter()
    left = iter(range(requests))
    end = time.monotonic() + seconds

    async def worker() -> None:
        for _ in left:
            if time.monotonic() > end:
                return
            answer = await client.post("/v1/embeddings", json=BODY, headers=bearer(key))
            statuses[answer.status_code] += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


async def steady(
    client: httpx.AsyncClient, key: str, requests: int, rate: float
) -> tuple[list[float], Counter[int]]:
    """``requests`` embeddings, one every 1/rate s (sent on schedule, not after the last
    answer): each one's seconds and the statuses seen."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()

    async def one(delay: float) -> None:
        await asyncio.sleep(delay)
        t0 = time.perf_counter()
        answer = await client.post("/v1/embeddings", json=BODY, headers=bearer(key))
        latencies.append(time.perf_counter() - t0)
        statuses[answer.status_code] += 1

    await asyncio.gather(*(one(i / rate) for i in range(requests)))
    return latencies, statuses


def keys_toml(flood_rps: float, steady_rps: float) -> str:
    from ember.api.keys import hash_key

    return (
        f'[[keys]]\nname = "flood"\nhash = "{hash_key(FLOOD_KEY)}"\n'
        f"requests_per_second = {flood_rps}\nmax_concurrent = 4\n"
        f'[[keys]]\nname = "steady"\nhash = "{hash_key(STEADY_KEY)}"\n'
        f"requests_per_second = {steady_rps}\n"
    )


def _summary(latencies: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in latencies]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "n": len(ms)}


def _flood_process(url: str, args: argparse.Namespace, out: Any) -> None:
    async def run() -> Counter[int]:
        limits = httpx.Limits(max_connections=args.concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
            return await flood(client, FLOOD_KEY, args.flood, args.concurrency, args.seconds)

    out.put(dict(asyncio.run(run())))


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await steady(client, STEADY_KEY, 20, 50.0)  # warm connections and the model
        alone, _ = await steady(client, STEADY_KEY, args.steady, args.rate)
        results = context.Queue()
        flooder = context.Process(target=_flood_process, args=(url, args, results))
        flooder.start()
        await asyncio.sleep(1.0)  # the flood under way (a spawned Python starts in ~0.5 s)
        loaded, steady_statuses = await steady(client, STEADY_KEY, args.steady, args.rate)
        flood_statuses = await asyncio.to_thread(results.get, True, args.seconds + 60)
        flooder.join(10)
    return {
        "steady_alone": _summary(alone),
        "steady_under_flood": _summary(loaded),
        "steady_statuses": dict(steady_statuses),
        "flood_statuses": dict(flood_statuses),
        "flood_rps_limit": args.flood_rps,
        "steady_rate": args.rate,
        "flood_concurrency": args.concurrency,
    }


def main() -> int:
    from ember.models.resolve import default_model_path
    from tests.support import start_server

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=100_000, help="flood requests at most")
    parser.add_argument("--seconds", type=float, default=13.0, help="flood time at most")
    parser.add_argument("--concurrency", type=int, default=16, help="flood workers")
    parser.add_argument("--flood-rps", type=float, default=5.0)
    parser.add_argument("--steady", type=int, default=100, help="steady requests per phase")
    parser.add_argument("--rate", type=float, default=10.0, help="steady requests per second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "keys.toml"
        path.write_text(keys_toml(args.flood_rps, args.rate * 4))
        serve = ["--model-id", str(default_model_path()), "--served-model-name", "minilm"]
        with start_server([*serve, "--api-keys-file", str(path)]) as server:
            row = asyncio.run(measure(server.url, args))
    print(json.dumps(row, indent=2))
    out = REPO / "benchmarks" / "results" / f"{dt.date.today().isoformat()}-api-keys"
    out.with_suffix(".json").write_text(json.dumps(row, indent=2) + "\n")
    a, b = row["steady_alone"], row["steady_under_flood"]
    out.with_suffix(".md").write_text(
        "# Per-key limits under a flood\n\n"
        f"`python benchmarks/api_keys.py` (flood key {args.flood_rps:g} req/s, "
        f"{args.concurrency} workers; steady key {args.rate:g} req/s, {args.steady} requests)\n\n"
        "| steady key | p50 ms | p99 ms |\n| --- | --- | --- |\n"
        f"| alone | {a['p50_ms']:.1f} | {a['p99_ms']:.1f} |\n"
        f"| under the flood | {b['p50_ms']:.1f} | {b['p99_ms']:.1f} |\n\n"
        f"Flood statuses: {row['flood_statuses']} in at most {args.seconds:g} s; steady "
        f"statuses: {row['steady_statuses']}. {os.cpu_count()} cores, MiniLM, default backend.\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
