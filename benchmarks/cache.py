"""The embedding cache on a repeated-query workload: hit rate, and throughput and latency with
the cache off and on, the same requests to the same model.

    PYTHONPATH=core:. .venv/bin/python benchmarks/cache.py                  # ~2 x 60 s at most
    PYTHONPATH=core:. .venv/bin/python benchmarks/cache.py --requests 1000 --time-limit 30

The workload: ``--requests`` single-query OpenAI embedding requests, each query drawn with
Zipf weights (exponent ``--zipf``) from ``--distinct`` short seeded queries (the benchmark
corpus's generator, 4-16 words), sent ``--concurrency`` at a time. Search traffic looks like
this: a few queries asked again and again, and a long tail asked once. Each configuration
gets its own `ember serve` (MiniLM, ``--backend``), started fresh so that the cache begins
empty; the hit rate is read from the server's own ``ember_cache_hits_total`` and
``ember_cache_misses_total``. Writes ``results/<date>-cache.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import dataclasses
import datetime as dt
import json
import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import corpus, loadgen, run  # noqa: E402


def workload(requests: int, distinct: int, exponent: float, seed: int) -> list[str]:
    """``requests`` queries drawn from ``distinct`` ones with Zipf weights (rank r has
    weight 1/r^exponent); a pure function of its arguments (``random()`` only)."""
    queries = corpus.make_sentences(distinct, seed=seed, min_words=4, max_words=16)
    weights = [1.0 / (rank**exponent) for rank in range(1, distinct + 1)]
    total, cdf, acc = sum(weights), [], 0.0
    for w in weights:
        acc += w / total
        cdf.append(acc)
    rng = random.Random(seed + 1)
    return [queries[min(bisect.bisect(cdf, rng.random()), distinct - 1)] for _ in range(requests)]


def cache_counts(base_url: str) -> dict[str, float]:
    """The server's cache counters, summed over models."""
    text = httpx.get(base_url + "/metrics", timeout=10, trust_env=False).text
    out = {}
    for kind in ("hits", "misses", "evictions"):
        values = re.findall(rf"^ember_cache_{kind}_total(?:{{[^}}]*}})? (\S+)$", text, re.M)
        out[kind] = sum(float(v) for v in values)
    return out


def measure(args: argparse.Namespace, queries: Sequence[str], entries: int) -> dict[str, Any]:
    """One fresh server with ``--cache-entries entries`` (0: off), the whole workload."""
    base = run.ember_server(f"{args.backend}:float32", sys.executable)
    flags = ["--cache-entries", str(entries)] if entries else []
    server = dataclasses.replace(
        base,
        name=f"{base.name}-cache-{entries or 'off'}",
        argv=lambda port, model: [*base.argv(port, model), *flags],
    )
    tokens = corpus.token_counts(queries)
    requests = [
        loadgen.Request("/v1/embeddings", {"model": run.MODEL_NAME, "input": q}, 1, n, "embed")
        for q, n in zip(queries, tokens, strict=True)
    ]
    live = run.start_server(server, args.model, "cache", args.ready_timeout)
    row: dict[str, Any] = {"cache_entries": entries, **live.row}
    if not live.ok:
        return row
    try:
        result = asyncio.run(
            loadgen.run_load(
                live.base_url,
                requests,
                name=server.name,
                concurrency=args.concurrency,
                time_limit_s=args.time_limit,
            )
        )
        row.update(result.summary())
        counts = cache_counts(live.base_url)
        looked = counts["hits"] + counts["misses"]
        row.update(counts, hit_rate=round(counts["hits"] / looked, 3) if looked else None)
    finally:
        run.stop(live.proc)  # type: ignore[arg-type]
    return row


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Embedding cache, repeated queries ({result['date']})",
        "",
        f"`{result['command']}`",
        "",
        f"{result['workload']}. Host: {result['cpu']}; load average before: {result['loadavg']}.",
        "",
        "| cache | ok | errors | requests/s | p50 ms | p99 ms | hit rate | evictions |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['cache_entries'] or 'off'} | failed: {r['error']} |")
            continue
        lines.append(
            f"| {r['cache_entries'] or 'off'} | {r['ok']} | {r['errors']} | "
            f"{r['items_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r.get('hit_rate') if r['cache_entries'] else '-'} | "
            f"{int(r.get('evictions', 0)) if r['cache_entries'] else '-'} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--distinct", type=int, default=500, help="distinct queries to draw from")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of the draw")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--cache-entries", type=int, default=10_000)
    p.add_argument("--backend", default="onnx")
    p.add_argument("--model", type=Path, default=None, help="default: the packaged MiniLM")
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds per configuration")
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=corpus.SEED)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from ember.models.resolve import default_model_path

        args.model = default_model_path()
    queries = workload(args.requests, args.distinct, args.zipf, args.seed)
    loadavg = run.loadavg()
    rows = [measure(args, queries, 0), measure(args, queries, args.cache_entries)]
    date = dt.date.today().isoformat()
    result = {
        "date": date,
        "command": " ".join(["benchmarks/cache.py", *(argv or sys.argv[1:])]),
        "workload": (
            f"{args.requests} one-query requests over {args.distinct} distinct queries "
            f"({len(set(queries))} drawn), Zipf {args.zipf}, concurrency {args.concurrency}, "
            f"MiniLM on {args.backend}, at most {args.time_limit:g} s per configuration"
        ),
        "cpu": run.cpu_name(),
        "loadavg": loadavg,
        "rows": rows,
    }
    run.RESULTS.mkdir(parents=True, exist_ok=True)
    (run.RESULTS / f"{date}-cache.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(result)
    (run.RESULTS / f"{date}-cache.md").write_text(text)
    print(text)
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
