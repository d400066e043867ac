"""Models on demand: how long a first request to an unloaded model takes against the
``load_seconds`` the server reports for that load, a warm request beside it, and the
resident memory over load/unload cycles.

    PYTHONPATH=core:. .venv/bin/python benchmarks/on_demand.py              # ~1-2 min
    PYTHONPATH=core:. .venv/bin/python benchmarks/on_demand.py --cycles 200 --rounds 5

In-process, through the route's own operation (``ember.api.operations.run`` with OpenAI's
and Cohere's translators, as ``POST /v1/embeddings`` and ``/v2/rerank`` run it): a catalogue
of the packaged MiniLM and the suite's tiny reranker and classifier (seeded, built into
``results/tmp/on-demand``), ``--max-loaded 1``, so each request to another model evicts the
one before and loads its own. Writes ``results/<date>-on-demand.md`` / ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ember.api import operations as ops  # noqa: E402
from ember.api.dialects import cohere, infinity, openai  # noqa: E402
from ember.config import settings_from_env  # noqa: E402
from ember.engine.array import EngineArray  # noqa: E402
from ember.engine.memory import resident_bytes  # noqa: E402

TMP = REPO / "benchmarks" / "results" / "tmp" / "on-demand"


def catalogue() -> Path:
    """MiniLM, a tiny reranker and a tiny classifier, in a models file."""
    from ember.models.resolve import default_model_path
    from tests.fixtures.tiny_models import build_tiny_classifier, build_tiny_reranker

    for name, build in (("reranker", build_tiny_reranker), ("classifier", build_tiny_classifier)):
        if not (TMP / name / "config.json").exists():
            build(TMP / name)
    path = TMP / "models.toml"
    path.write_text(
        f'[models.minilm]\nmodel_id = "{default_model_path()}"\n'
        f'[models.reranker]\nmodel_id = "{TMP / "reranker"}"\n'
        f'[models.classifier]\nmodel_id = "{TMP / "classifier"}"\n'
    )
    return path


BODIES = {
    "minilm": (openai.EMBEDDINGS, lambda: openai.EmbeddingsRequest(model="minilm", input="hi")),
    "reranker": (
        cohere.RERANK,
        lambda: cohere.RerankRequest(model="reranker", query="q", documents=["a", "b"]),
    ),
    "classifier": (
        infinity.CLASSIFY,
        lambda: infinity.ClassifyRequest(model="classifier", input=["fine"]),
    ),
}


async def request(engines: EngineArray, name: str) -> float:
    translator, body = BODIES[name]
    started = time.perf_counter()
    await ops.run(translator, engines, body(), 2048)
    return time.perf_counter() - started


async def measure(args: argparse.Namespace) -> dict:
    settings = settings_from_env(
        models_file=str(catalogue()), max_loaded=1, backend=args.backend, dtype="float32"
    )
    engines = EngineArray.from_settings(settings)
    await engines.start()
    rows: dict[str, dict[str, list[float]]] = {
        n: {"first": [], "load": [], "warm": []} for n in BODIES
    }
    try:
        for name in BODIES:  # artifacts built (ONNX export) before anything is timed
            await request(engines, name)
        for _ in range(args.rounds):
            for name in BODIES:
                first = await request(engines, name)
                slot = engines.residency.named(name)
                assert slot is not None and slot.load_seconds is not None
                warm = statistics.median([await request(engines, name) for _ in range(5)])
                rows[name]["first"].append(first)
                rows[name]["load"].append(slot.load_seconds)
                rows[name]["warm"].append(warm)
        start = resident_bytes()
        t0 = time.perf_counter()
        names = list(BODIES)
        for i in range(args.cycles):
            await request(engines, names[i % 3])
        cycle_seconds = time.perf_counter() - t0
        end = resident_bytes()
        memory = {n: s.measured_bytes for n in names if (s := engines.residency.named(n))}
    finally:
        await engines.stop()
    return {
        "models": {
            n: {k: statistics.median(v) for k, v in r.items()} | {"measured_bytes": memory[n]}
            for n, r in rows.items()
        },
        "cycles": args.cycles,
        "cycle_seconds": cycle_seconds,
        "rss_start": start,
        "rss_end": end,
    }


def report(result: dict, args: argparse.Namespace) -> str:
    lines = [
        f"# Models on demand ({dt.date.today()})",
        "",
        f"Host: {platform.processor() or platform.machine()}, {args.host}. Backend "
        f"`{args.backend}`, float32, `--max-loaded 1`: every request below to another model "
        f"evicted the one before. Medians of {args.rounds} rounds.",
        f"Command: `PYTHONPATH=core:. .venv/bin/python benchmarks/on_demand.py "
        f"--cycles {args.cycles} --rounds {args.rounds}`",
        "",
        "| model | first request (s) | its load_seconds | first - load (s) | warm request (ms) "
        "| measured bytes |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in result["models"].items():
        lines.append(
            f"| {name} | {row['first']:.3f} | {row['load']:.3f} | "
            f"{row['first'] - row['load']:.3f} | {row['warm'] * 1000:.1f} | "
            f"{row['measured_bytes']:,} |"
        )
    growth = result["rss_end"] / result["rss_start"] - 1
    lines += [
        "",
        f"{result['cycles']} load/unload cycles (one request each, rotating the three models): "
        f"{result['cycle_seconds']:.1f} s; resident memory {result['rss_start'] / 2**20:.1f} "
        f"-> {result['rss_end'] / 2**20:.1f} MiB ({growth:+.1%}).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backend", default="onnx")
    parser.add_argument("--host", default="2-core AMD EPYC (AVX2), shared with other work")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    stem = args.out / f"{dt.date.today()}-on-demand"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(report(result, args))
    print(report(result, args))


if __name__ == "__main__":
    main()
