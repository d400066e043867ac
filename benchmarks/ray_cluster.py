"""`ember embed --ray` on a multi-node cluster started on this machine: where the work goes.

A head with no CPUs and ``--nodes`` worker nodes of one CPU each (``tests/ray_cluster.py``,
each node its own raylet), the packaged MiniLM, seeded sentences (benchmarks/corpus.py).
Per run, from the job's own summary: rows/s after start-up, the start-up apart, the
driver's CPU seconds over the run (per 1,000 rows, and as a share of one core), and each
node's share of the rows. The cluster is stopped at the end, whatever happens.

    PYTHONPATH=core:. .venv/bin/python benchmarks/ray_cluster.py --rows 16000

Writes results/<date>-ray-cluster.md and .json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
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
from tests.ray_cluster import Cluster  # noqa: E402
from tests.support import child_env  # noqa: E402


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# `ember embed --ray` on a {result['nodes'] + 1}-node cluster of one machine, "
        f"{result['date']}",
        "",
        f"{result['rows']} rows, {result['model']}, {result['backend']}, {result['cores']} "
        f"cores; a head with no CPUs and {result['nodes']} worker nodes of 1 CPU (each its "
        f"own raylet). Command: `{result['command']}`. The host was shared with other work.",
        "",
        "| run | rows/s after start-up | start-up s | driver CPU s | driver CPU s / 1,000 rows "
        "| driver share of a core | rows by node |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in result["runs"]:
        shares = ", ".join(
            f"{rows} ({100 * rows / run['rows_this_run']:.0f}%)"
            for rows in run["rows_by_node"].values()
        )
        lines.append(
            f"| {run['kind']} | {run['rows_per_second']} | {run['startup_s']} | "
            f"{run['driver_cpu_s']} | {run['driver_cpu_s_per_1000_rows']} | "
            f"{100 * run['driver_cpu_share']:.1f}% | {shares} |"
        )
    lines += ["", "Every summary:", "", "```", *map(json.dumps, result["runs"]), "```", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16000)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--backend", default="torch:float32")
    parser.add_argument("--shard-rows", type=int, default=None, help="default: the job's")
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()

    from ember.models.resolve import default_model_path

    model = default_model_path()
    work = TMP / "ray-cluster"
    corpus = write_corpus(make_sentences(args.rows), work / "corpus.jsonl")
    # Workers at nice 0, as the job's own local cluster runs them (Ray's default is 15):
    # on a shared host the figures are then the job's, not the scheduler's.
    env = child_env({"RAY_worker_niceness": "0"}, drop_prefixes=("EMBER_", "RAY_ADDRESS"))
    cluster = Cluster(env)
    runs: list[dict[str, Any]] = []
    try:
        cluster.start()
        for _ in range(args.nodes - 2):
            cluster.add_node()
        extra = [f"--ray={cluster.address}"]
        if args.shard_rows:
            extra += ["--shard-rows", str(args.shard_rows)]
        argv = job_argv(args.backend, model, corpus, work / "out", sys.executable, extra)
        os.environ["HOME"] = cluster.home  # the driver joins with the cluster's own home
        started = time.perf_counter()
        summary = run_job(argv, args.timeout)
        summary["wall_s"] = round(time.perf_counter() - started, 1)
        runs.append({"kind": "--ray, multi-node", **summary})
        print(json.dumps(runs[-1]), flush=True)
    finally:
        cluster.remove()
    result = {
        "date": dt.date.today().isoformat(),
        "rows": args.rows,
        "nodes": args.nodes,
        "backend": args.backend,
        "model": "all-MiniLM-L6-v2 (the packaged default)",
        "cores": os.cpu_count(),
        "command": "PYTHONPATH=core:. .venv/bin/python benchmarks/ray_cluster.py "
        + " ".join(sys.argv[1:]),
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{result['date']}-ray-cluster"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
