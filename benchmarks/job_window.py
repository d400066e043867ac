"""How the corpus job's window (``--in-flight``) shapes batches, per backend, in-process.

The job queues up to ``in_flight`` inputs ahead of the oldest unanswered one, so the batcher
chooses among that many: batches grow towards ``max_batch_size`` with less padding. Whether
that is faster depends on the backend's cost per batch shape, which this measures with
nothing else in the way: one engine per backend, the job run over the same corpus with each
window in turn (rounds alternating), the forward passes timed on their threads.

    PYTHONPATH=core .venv/bin/python benchmarks/job_window.py --backends ct2:int8,torch:float32

Reports wall seconds, the process's CPU seconds (all threads: less moved by other load on
the host than the wall), batches, mean batch size and padded/real tokens. Writes
results/<date>-cpu-job-window.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import corpus as corpus_mod  # noqa: E402
from benchmarks import run as bench_run  # noqa: E402
from benchmarks.job import write_corpus  # noqa: E402


def _cpu_seconds() -> float:
    """This process's CPU, every thread (the backends' own pools too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def measure(spec: str, corpus: Path, windows: Sequence[int], rounds: int) -> dict[str, Any]:
    from ember.config import settings_from_env
    from ember.engine import EngineArray
    from ember.jobs.inputs import InputSpec
    from ember.jobs.runner import JobOptions, job_settings, run_embed_job

    backend, _, dtype = spec.partition(":")
    settings = settings_from_env(
        backend=backend,
        dtype=dtype or "auto",
        device="cpu",
        cache_dir=str(bench_run.TMP / f"ember-cache-{REPO.name}"),
        log_level="warning",
    )
    widest = JobOptions(output=Path(), in_flight=max(windows))
    engines = EngineArray(job_settings(settings, widest).model_specs())
    await engines.start()
    engine = engines.get(None)
    assert engine.batcher is not None
    forwards: list[tuple[int, int, int]] = []  # rows, longest, real tokens
    run_batch = engine.batcher.run

    def counted(work: Sequence[Any]) -> Sequence[Any]:
        costs = [w.cost for w in work]
        forwards.append((len(costs), max(costs), sum(costs)))
        return run_batch(work)

    engine.batcher.run = counted
    source = InputSpec.of(corpus, id_column="id")
    runs: dict[int, list[dict[str, float]]] = {w: [] for w in windows}
    try:
        with tempfile.TemporaryDirectory() as out:
            for _ in range(rounds):
                for window in windows:
                    forwards.clear()
                    options = JobOptions(
                        output=Path(out), in_flight=window, overwrite=True, progress=False
                    )
                    started, cpu = time.perf_counter(), _cpu_seconds()
                    await run_embed_job(engine, source, options)
                    runs[window].append(
                        {
                            "wall_s": time.perf_counter() - started,
                            "cpu_s": _cpu_seconds() - cpu,
                            "batches": len(forwards),
                            "mean_rows": sum(f[0] for f in forwards) / len(forwards),
                            "padded_over_real": sum(f[0] * f[1] for f in forwards)
                            / sum(f[2] for f in forwards),
                        }
                    )
    finally:
        await engines.stop()
    return {
        str(w): {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
        for w, rs in runs.items()
    }


def markdown(result: dict[str, Any]) -> str:
    m = result["meta"]
    out = [
        f"# The corpus job's window per backend, in-process — {m['date']}",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores; other processes used "
        f"{m['foreign_cpu']['mean_cores']} cores on average (max {m['foreign_cpu']['max_cores']}).",
        f"- all-MiniLM-L6-v2, {m['sentences']} sentences of benchmarks/corpus.py, default batcher "
        f"settings; medians of {m['rounds']} rounds, windows alternating within each round.",
        f"- Command: `{m['command']}`",
        "",
        "| backend | --in-flight | wall s | CPU s | batches | rows/batch | padded/real |",
        "|---|---|---|---|---|---|---|",
    ]
    for spec, windows in result["backends"].items():
        for window, r in windows.items():
            out.append(
                f"| {spec} | {window} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
                f"{r['batches']:.0f} | {r['mean_rows']:.1f} | {r['padded_over_real']:.3f} |"
            )
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="torch:float32,onnx:float32,ct2:int8")
    p.add_argument("--windows", default="64,128,512,4096")
    p.add_argument("--sentences", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    foreign = bench_run.ForeignCpu().start()
    corpus = write_corpus(
        corpus_mod.make_corpus(args.sentences).sentences, bench_run.TMP / "job-window.jsonl"
    )
    windows = [int(w) for w in args.windows.split(",")]
    backends = {}
    for spec in [s for s in args.backends.split(",") if s]:
        print(f"[window] {spec} ...", file=sys.stderr, flush=True)
        backends[spec] = asyncio.run(measure(spec, corpus, windows, args.rounds))
    date = dt.date.today().isoformat()
    result = {
        "meta": {
            "date": date,
            "cpu": bench_run.cpu_name(),
            "cores": os.cpu_count(),
            "sentences": args.sentences,
            "rounds": args.rounds,
            "foreign_cpu": foreign.stop(),
            "command": " ".join(["benchmarks/job_window.py", *(argv or sys.argv[1:])]),
        },
        "backends": backends,
    }
    text = markdown(result)
    print(text)
    out = args.out or bench_run.RESULTS / f"{date}-cpu-job-window.md"
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
