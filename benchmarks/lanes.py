"""Priority lanes under load (docs/operations/lanes.md): one-text queries in the
interactive lane while bulk clients keep the server saturated, and bulk under a flood of
interactive work.

    PYTHONPATH=core:. .venv/bin/python benchmarks/lanes.py                     # ~6 min
    PYTHONPATH=core:. .venv/bin/python benchmarks/lanes.py --starve-seconds 600

One `ember serve` of the packaged MiniLM (default flags: bulk batches capped at a quarter
of --max-batch-tokens). Phases, in order:

1. idle: one-text queries (``service_tier: priority``), one every 1/``--rate`` s,
   nothing else running: their p50/p99;
2. bulk alone: ``--bulk-clients`` clients send requests of ``--bulk-texts`` texts
   (``service_tier: flex``) back to back for ``--seconds``: bulk tokens/s, the bulk lane's
   tokens forwarded (``ember_lane_tokens_total``) from 3 s in to the end;
3. bulk + queries: the same bulk load, and the queries of phase 1 again: their p99 against
   idle p99 plus one capped bulk batch, and bulk's tokens/s against phase 2's;
4. starvation: ``--flood-clients`` clients send interactive requests of ``--flood-texts``
   texts back to back (the interactive lane saturated: one-text queries flood the HTTP
   front before they fill the forwards) with the bulk load, for ``--starve-seconds``:
   bulk's share of the tokens forwarded (``ember_lane_tokens_total``) per ``--window``
   s, against its weight's share (1/10 with the default 9,3,1).

Load runs in processes of their own (aiohttp, bodies serialised before the clock), on the
same cores as the server: on a small host the clients take CPU from it alike in every
phase. Writes ``results/<date>-lanes.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.loadgen import percentile  # noqa: E402

WORDS = (
    "index corpus shard vector query token batch lane model server queue answer record "
    "field value search document latency share fleet ember window client forward"
).split()
QUERY = "where is the nearest open pharmacy"


def bulk_texts(count: int, words: int, seed: int) -> list[str]:
    """``count`` texts of ``words`` pseudo-words each (about 1.3 tokens a word), fixed by
    ``seed``: every phase sends the same bulk work."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]


def body(inputs: list[str] | str, tier: str) -> bytes:
    import orjson

    return orjson.dumps({"model": "minilm", "input": inputs, "service_tier": tier})


async def _clients(
    url: str, payloads: list[bytes], clients: int, seconds: float
) -> dict[str, float]:
    """``clients`` workers posting ``payloads`` in turn, back to back, for ``seconds``:
    the prompt tokens answered, requests, errors and the seconds it ran."""
    import aiohttp

    answered = {"tokens": 0.0, "requests": 0.0, "errors": 0.0}
    end = time.monotonic() + seconds
    headers = {"content-type": "application/json"}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(url, timeout=timeout) as session:

        async def worker(k: int) -> None:
            n = k
            while time.monotonic() < end:
                payload = payloads[n % len(payloads)]
                n += clients
                async with session.post("/v1/embeddings", data=payload, headers=headers) as r:
                    data = await r.read()
                if r.status != 200:
                    answered["errors"] += 1
                    continue
                import orjson

                answered["tokens"] += orjson.loads(data)["usage"]["prompt_tokens"]
                answered["requests"] += 1

        started = time.monotonic()
        await asyncio.gather(*(worker(k) for k in range(clients)))
        answered["seconds"] = time.monotonic() - started
    return answered


def _load_process(url: str, payloads: list[bytes], clients: int, seconds: float, out: Any) -> None:
    out.put(asyncio.run(_clients(url, payloads, clients, seconds)))


def start_load(url: str, payloads: list[bytes], clients: int, seconds: float) -> tuple[Any, Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_load_process, args=(url, payloads, clients, seconds, results))
    process.start()
    return process, results


def finish_load(process: Any, results: Any, seconds: float) -> dict[str, float]:
    row = results.get(True, seconds + 180)
    process.join(30)
    return row


async def queries(url: str, count: int, rate: float) -> tuple[list[float], list[str]]:
    """``count`` one-text interactive queries, one every 1/``rate`` s (on schedule): each
    one's seconds and the lane each was served in."""
    import aiohttp

    payload = body(QUERY, "priority")
    seconds: list[float] = []
    lanes: list[str] = []
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(url) as session:

        async def one(delay: float) -> None:
            await asyncio.sleep(delay)
            t0 = time.perf_counter()
            async with session.post("/v1/embeddings", data=payload, headers=headers) as r:
                await r.read()
                assert r.status == 200, r.status
                lanes.append(r.headers["x-ember-priority"])
            seconds.append(time.perf_counter() - t0)

        await asyncio.gather(*(one(i / rate) for i in range(count)))
    return seconds, lanes


def lane_tokens(url: str) -> dict[str, float]:
    """``ember_lane_tokens_total`` per lane, from /metrics."""
    import httpx

    found = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("ember_lane_tokens_total{"):
            labels, value = line.rsplit(" ", 1)
            lane = labels.split('lane="', 1)[1].split('"', 1)[0]
            found[lane] = float(value)
    return found


async def _bulk_rate(url: str, seconds: float) -> float:
    """Bulk tokens forwarded a second (``ember_lane_tokens_total``) over ``seconds``, from
    3 s in (the load's clients started and its queue filled)."""
    await asyncio.sleep(3.0)
    before = await asyncio.to_thread(lane_tokens, url)
    t0 = time.monotonic()
    await asyncio.sleep(seconds - 3.0)
    after = await asyncio.to_thread(lane_tokens, url)
    return (after.get("bulk", 0.0) - before.get("bulk", 0.0)) / (time.monotonic() - t0)


async def _queries_under_load(
    url: str, args: argparse.Namespace
) -> tuple[list[float], list[str], float]:
    """The queries while the bulk load runs, and bulk's tokens/s meanwhile."""
    rate = asyncio.create_task(_bulk_rate(url, args.seconds))
    await asyncio.sleep(3.0)
    loaded, served = await queries(url, args.queries, args.rate)
    return loaded, served, await rate


def _ms(latencies: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in latencies]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "n": len(ms)}


async def _windows(url: str, seconds: float, window: float) -> list[dict[str, float]]:
    """Each lane's tokens forwarded in every ``window`` s of ``seconds``."""
    rows = []
    before = await asyncio.to_thread(lane_tokens, url)
    end = time.monotonic() + seconds
    while time.monotonic() + window <= end + 0.5:
        await asyncio.sleep(window)
        now = await asyncio.to_thread(lane_tokens, url)
        rows.append({lane: now.get(lane, 0.0) - before.get(lane, 0.0) for lane in now})
        before = now
    return rows


def measure(url: str, args: argparse.Namespace, cap: int, workers: int) -> dict[str, Any]:
    texts = bulk_texts(args.bulk_texts * 16, args.words, seed=7)
    chunks = [texts[i : i + args.bulk_texts] for i in range(0, len(texts), args.bulk_texts)]
    bulk = [body(chunk, "flex") for chunk in chunks]
    # the interactive lane saturated: requests of several texts, so that it always has work
    # waiting (one-text queries flood the HTTP front before they fill the forwards)
    flood = [body(chunk[: args.flood_texts], "priority") for chunk in chunks]
    asyncio.run(queries(url, 20, 20.0))  # warm connections and the model
    idle: list[float] = []
    loaded: list[float] = []
    served: list[str] = []
    rounds = []
    # Rounds of idle / bulk alone / bulk + queries, side by side: the host's other load
    # drifts over minutes, and each ratio compares phases a minute apart.
    for _ in range(args.rounds):
        idle += asyncio.run(queries(url, args.queries // 2, args.rate))[0]
        process, results = start_load(url, bulk, args.bulk_clients, args.seconds + 4)
        alone_tps = asyncio.run(_bulk_rate(url, args.seconds))
        alone = finish_load(process, results, args.seconds)
        process, results = start_load(url, bulk, args.bulk_clients, args.seconds + 4)
        some, lanes, mixed_tps = asyncio.run(_queries_under_load(url, args))
        mixed = finish_load(process, results, args.seconds)
        loaded += some
        served += lanes
        rounds.append(
            {
                "bulk_alone": {**alone, "tokens_per_s": alone_tps},
                "bulk_with_queries": {**mixed, "tokens_per_s": mixed_tps},
                "bulk_kept": mixed_tps / alone_tps,
                "interactive_under_bulk": _ms(some),
            }
        )
    alone_tps = sum(r["bulk_alone"]["tokens_per_s"] for r in rounds) / len(rounds)
    mixed_tps = sum(r["bulk_with_queries"]["tokens_per_s"] for r in rounds) / len(rounds)

    process, results = start_load(url, bulk, args.bulk_clients, args.starve_seconds + 4)
    flooder, flooded = start_load(url, flood, args.flood_clients, args.starve_seconds + 4)
    time.sleep(3.0)
    windows = asyncio.run(_windows(url, args.starve_seconds, args.window))
    starved = finish_load(process, results, args.starve_seconds)
    floods = finish_load(flooder, flooded, args.starve_seconds)

    # One capped bulk batch: the cap's tokens on one of the forward workers, at the bulk
    # rate measured alone (all workers together).
    batch_s = cap * workers / alone_tps
    shares = [
        w.get("bulk", 0.0) / max(1.0, w.get("bulk", 0.0) + w.get("interactive", 0.0))
        for w in windows
    ]
    idle_ms, loaded_ms = _ms(idle), _ms(loaded)
    return {
        "bulk_batch_tokens": cap,
        "forward_workers": workers,
        "one_capped_bulk_batch_ms": batch_s * 1000,
        "interactive_idle": idle_ms,
        "interactive_under_bulk": loaded_ms,
        "interactive_served_lanes": sorted(set(served)),
        "p99_bound_ms": idle_ms["p99_ms"] + batch_s * 1000,
        "p99_within_bound": loaded_ms["p99_ms"] <= idle_ms["p99_ms"] + batch_s * 1000,
        "bulk_alone_tokens_per_s": alone_tps,
        "bulk_with_queries_tokens_per_s": mixed_tps,
        "bulk_kept": mixed_tps / alone_tps,
        "rounds": rounds,
        "starvation": {
            "seconds": args.starve_seconds,
            "window_s": args.window,
            "flood_clients": args.flood_clients,
            "windows": windows,
            "bulk_share_per_window": shares,
            "bulk_share_min": min(shares) if shares else None,
            "bulk_share_overall": sum(w.get("bulk", 0.0) for w in windows)
            / max(1.0, sum(w.get("bulk", 0.0) + w.get("interactive", 0.0) for w in windows)),
            "bulk": {**starved, "tokens_per_s": starved["tokens"] / starved["seconds"]},
            "flood": floods,
        },
    }


def report(row: dict[str, Any], args: argparse.Namespace) -> str:
    idle, loaded = row["interactive_idle"], row["interactive_under_bulk"]
    starve = row["starvation"]
    errors = sum(
        r["bulk_alone"]["errors"] + r["bulk_with_queries"]["errors"] for r in row["rounds"]
    )
    shares = ", ".join(f"{s:.2f}" for s in starve["bulk_share_per_window"])
    return (
        "# Priority lanes under load\n\n"
        f"`python benchmarks/lanes.py --seconds {args.seconds:g} --rounds {args.rounds} "
        f"--starve-seconds {args.starve_seconds:g} --window {args.window:g}` on "
        f"{os.cpu_count()} cores (a shared, busy host): the packaged "
        f"MiniLM, default backend, {row['forward_workers']} forward workers, bulk batches "
        f"capped at {row['bulk_batch_tokens']} tokens (one such batch: "
        f"{row['one_capped_bulk_batch_ms']:.0f} ms at the bulk rate alone). Bulk: "
        f"{args.bulk_clients} clients x {args.bulk_texts} texts of {args.words} words "
        f"(`service_tier: flex`); queries: one text (`service_tier: priority`), "
        f"{args.rate:g}/s. {args.rounds} rounds of idle queries ({args.queries // 2}), bulk "
        f"alone ({args.seconds:g} s), bulk with queries ({args.seconds:g} s, {args.queries} "
        "queries); the percentiles pool the rounds.\n\n"
        "| one-text queries | p50 ms | p99 ms |\n| --- | --- | --- |\n"
        f"| idle | {idle['p50_ms']:.1f} | {idle['p99_ms']:.1f} |\n"
        f"| bulk saturating | {loaded['p50_ms']:.1f} | {loaded['p99_ms']:.1f} |\n\n"
        f"Bound (idle p99 + one capped bulk batch): {row['p99_bound_ms']:.0f} ms; "
        f"within: **{row['p99_within_bound']}**.\n\n"
        "| round | bulk alone tokens/s | bulk with queries tokens/s | kept | queries p99 ms |\n"
        "| --- | --- | --- | --- | --- |\n"
        + "".join(
            f"| {k} | {r['bulk_alone']['tokens_per_s']:.0f} | "
            f"{r['bulk_with_queries']['tokens_per_s']:.0f} | {r['bulk_kept']:.0%} | "
            f"{r['interactive_under_bulk']['p99_ms']:.0f} |\n"
            for k, r in enumerate(row["rounds"], 1)
        )
        + f"\nBulk kept **{row['bulk_kept']:.0%}** of its tokens/s alone over the rounds "
        f"({row['bulk_with_queries_tokens_per_s']:.0f} of "
        f"{row['bulk_alone_tokens_per_s']:.0f}; the bar: 90%); bulk requests failed: "
        f"{errors:.0f}.\n\n"
        f"Starvation: {starve['flood_clients']} clients flooding the interactive lane "
        f"(requests of {args.flood_texts} texts, back to back) with the bulk load, "
        f"{starve['seconds']:g} s: bulk's share of the tokens forwarded per "
        f"{starve['window_s']:g} s window: {shares} (least "
        f"**{starve['bulk_share_min']:.2f}**, over the whole run "
        f"**{starve['bulk_share_overall']:.3f}**; its weight's share 0.10); bulk answered "
        f"{starve['bulk']['tokens_per_s']:.0f} tokens/s, {starve['bulk']['errors']:.0f} "
        f"errors; the flood {starve['flood']['tokens'] / starve['seconds']:.0f} tokens/s, "
        f"{starve['flood']['errors']:.0f} errors.\n"
    )


def main() -> int:
    from ember.config import ServerSettings
    from ember.cpu import cpu_forward_plan
    from ember.engine.batcher import bulk_tokens_for
    from ember.models.resolve import default_model_path
    from tests.support import start_server

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=300, help="queries per phase")
    parser.add_argument("--rate", type=float, default=5.0, help="queries per second")
    parser.add_argument("--seconds", type=float, default=40.0, help="bulk phases' length")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bulk-clients", type=int, default=4)
    parser.add_argument("--bulk-texts", type=int, default=32, help="texts per bulk request")
    parser.add_argument("--words", type=int, default=48, help="words per bulk text")
    parser.add_argument("--flood-clients", type=int, default=8)
    parser.add_argument("--flood-texts", type=int, default=16, help="texts per flood request")
    parser.add_argument("--starve-seconds", type=float, default=120.0)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--out", default=f"{dt.date.today().isoformat()}-lanes")
    args = parser.parse_args()
    args.queries = min(args.queries, int(args.rate * (args.seconds - 5)))  # inside the load
    spec = ServerSettings().model_specs()[0]
    cap = spec.bulk_batch_tokens or bulk_tokens_for("cpu", spec.max_batch_tokens)
    workers = cpu_forward_plan()[0]
    serve = ["--model-id", str(default_model_path()), "--served-model-name", "minilm"]
    with tempfile.TemporaryDirectory():
        with start_server(serve) as server:
            row = measure(server.url, args, cap, workers)
    print(json.dumps(row, indent=2))
    out = REPO / "benchmarks" / "results" / args.out
    out.with_suffix(".json").write_text(json.dumps(row, indent=2) + "\n")
    out.with_suffix(".md").write_text(report(row, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
