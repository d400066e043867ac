"""`ember embed` in-process against `ember embed --ray` on this machine: what Ray costs.

The same corpus (seeded sentences of 8-120 words, benchmarks/corpus.py), model and
backend, rounds alternating the two so a burst of other load hits both. Each run is a
fresh process (--ray: a fresh local cluster with ``--ray-workers`` actors, shards sized by
the job unless ``--shard-rows`` is given). Per run: the process's wall time (model
loading, Ray's start and stop in it); the job's own rate from its summary (in-process: from
the first row sent; --ray: from the first worker ready, its ``startup_s`` reported apart);
and, for --ray, the driver's CPU seconds over that time and the rows each node embedded.

    PYTHONPATH=core:. .venv/bin/python benchmarks/ray_job.py --rows 16000 --rounds 1

Writes results/<date>-ray-job.md and .json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.corpus import make_sentences  # noqa: E402
from benchmarks.job import job_argv, run_job, write_corpus  # noqa: E402
from benchmarks.run import RESULTS, TMP  # noqa: E402


def steady_rate(out: Path) -> float:
    """Rows after the first shard over the seconds from its write to the last one's."""
    checkpoint = json.loads((out / "_ember_job.json").read_text())
    shards = checkpoint["shards"]
    times = [(out / s["name"]).stat().st_mtime for s in shards]
    rows = sum(s["rows"] for s in shards[1:])
    return rows / (times[-1] - times[0]) if len(shards) > 1 and times[-1] > times[0] else 0.0


EXTRA = ("startup_s", "shard_rows", "driver_cpu_s", "driver_cpu_share", "rows_by_node")


def one_run(kind: str, argv: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    started = time.perf_counter()
    summary = run_job(argv, timeout_s)
    wall = time.perf_counter() - started
    rate = steady_rate(out)
    return {
        "kind": kind,
        "rows": summary["rows"],
        "wall_s": round(wall, 1),
        "wall_rows_per_s": round(summary["rows"] / wall, 1),
        "job_rows_per_s": summary["rows_per_second"],
        "steady_rows_per_s": round(rate, 1),
        **{key: summary[key] for key in EXTRA if key in summary},
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# `ember embed` in-process vs `--ray`, {result['date']}",
        "",
        f"{result['rows']} rows, {result['model']}, {result['backend']}, shards of "
        f"{result['shard_rows'] or 'the job default'}, {result['cores']} cores; "
        "--ray: a local cluster, "
        f"{result['workers']} workers of 1 CPU. Command: `{result['command']}`",
        "",
        "wall: the process, start to exit; job: the summary's own rate (in-process: from "
        "the first row sent, model loading excluded; --ray: from the first worker ready, "
        "the cluster's start and the model loads before it: `startup_s`); first-to-last "
        "shard: rows after the first shard over the time between the two writes.",
        "",
        "| run | wall s | rows/s over wall | job rows/s | first-to-last shard rows/s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, med in result["medians"].items():
        lines.append(
            f"| {kind} | {med['wall_s']} | {med['wall_rows_per_s']} | {med['job_rows_per_s']} "
            f"| {med['steady_rows_per_s']} |"
        )
    ratio = result["medians"]["ray"]["job_rows_per_s"] / max(
        result["medians"]["in-process"]["job_rows_per_s"], 1e-9
    )
    lines += ["", f"--ray / in-process, job rows/s (medians): {ratio:.2f}"]
    lines += ["", "Every run:", "", "```", *map(json.dumps, result["runs"]), "```", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shard-rows", type=int, default=None, help="default: the job's")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", default="torch:float32")
    parser.add_argument("--model", default=None, help="default: the packaged MiniLM")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()

    from ember.models.resolve import default_model_path

    model = Path(args.model) if args.model else default_model_path()
    work = TMP / "ray-job"
    corpus = write_corpus(make_sentences(args.rows), work / "corpus.jsonl")
    runs: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        for kind in ("in-process", "ray"):
            out = work / f"out-{kind}"
            extra: list[str] = []
            if args.shard_rows:
                extra += ["--shard-rows", str(args.shard_rows)]
            if kind == "ray":
                extra += ["--ray", "--ray-workers", str(args.workers)]
            argv = job_argv(args.backend, model, corpus, out, sys.executable, extra)
            runs.append(one_run(kind, argv, out, args.timeout))
            print(json.dumps(runs[-1]), flush=True)
    medians = {
        kind: {
            key: round(statistics.median(r[key] for r in runs if r["kind"] == kind), 1)
            for key in ("wall_s", "wall_rows_per_s", "job_rows_per_s", "steady_rows_per_s")
        }
        for kind in ("in-process", "ray")
    }
    result = {
        "date": dt.date.today().isoformat(),
        "rows": args.rows,
        "shard_rows": args.shard_rows,
        "workers": args.workers,
        "backend": args.backend,
        "model": args.model or "all-MiniLM-L6-v2 (the packaged default)",
        "cores": os.cpu_count(),
        "command": "PYTHONPATH=core:. .venv/bin/python benchmarks/ray_job.py "
        + " ".join(sys.argv[1:]),
        "runs": runs,
        "medians": medians,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{result['date']}-ray-job"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
