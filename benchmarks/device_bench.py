"""The prepared device run: `ember serve` and Infinity (torch engine) serving the same
bge-base-shaped model over HTTP on one GPU, under three loads, one server at a time.

  a  16 inputs of 384-512 tokens per request, 8 clients      (bulk indexing, long passages)
  b  the anchor corpus's length mix, 32 inputs per request, 8 clients
  c  one ~32-token input per request, 64 clients             (queries)

Reported per server and load: real (unpadded) tokens/s, requests/s, inputs/s, p50/p99,
the GPU's busy share (NVML's utilization.gpu, what nvidia-smi shows, sampled every 50 ms
while the load runs), model FLOP/s on real tokens (``benchmarks/flops.py``) as a share of a
bf16 GEMM measured in the same run and of the card's data-sheet peak, and for Ember where
each request's time went (tokenise, queue, forward, serialize: its ``ember_stage_seconds``
histogram, read before and after the load). Then the issue's bars, each met or not.

The client is ``benchmarks/loadgen.py`` (aiohttp) in several processes, so that Python on
the client side is not what is measured. Everything runs on the machine it is started on.

    bash benchmarks/device.sh                   # on the GPU machine (see that script)
    PYTHONPATH=core:. python benchmarks/device_bench.py --device cpu --tiny --seconds 2 \\
        --tokenizer DIR --out /tmp/out         # the CPU smoke run the suite does
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "core"), str(REPO)]

from benchmarks import corpus as corpus_mod  # noqa: E402
from benchmarks import loadgen  # noqa: E402
from benchmarks import run as bench_run  # noqa: E402
from benchmarks.flops import model_shape  # noqa: E402
from benchmarks.gpu_bench import DENSE_BF16_TFLOPS  # noqa: E402

HOST, MODEL_NAME = bench_run.HOST, bench_run.MODEL_NAME
LOADS = {  # name -> (inputs per request, clients)
    "a": (16, 8),
    "b": (32, 8),
    "c": (1, 64),
}
STAGES = ("tokenize", "queue", "forward", "serialize")


@dataclass
class Row:
    server: str
    load: str
    status: str = "ok"  # or why it did not run
    requests_per_s: float = 0.0
    inputs_per_s: float = 0.0
    tokens_per_s: float = 0.0  # real tokens, special tokens included, none of padding
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    errors: int = 0
    gpu_busy: float | None = None  # share of samples' utilization.gpu, 0..1
    tflops: float = 0.0
    frac_gemm: float = 0.0
    frac_peak: float | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)  # Ember: mean per request
    error_samples: list[str] = field(default_factory=list)


# --- inputs -----------------------------------------------------------------------------


def load_texts(tokenizer_json: Path, seed: int = 0) -> dict[str, list[tuple[str, int]]]:
    """Each load's texts with their token counts (the model's tokenizer, specials included,
    capped at 512 as both servers truncate)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_truncation()
    tok.no_padding()

    def count(texts: Sequence[str]) -> list[int]:
        return [min(512, len(e.ids)) for e in tok.encode_batch(list(texts))]

    rng = random.Random(seed)
    sentences = corpus_mod.make_corpus(corpus_mod.N_SENTENCES).sentences
    long_texts = []
    for _ in range(64):
        target = rng.randint(384, 512)
        words: list[str] = []
        while len(words) < target:  # about a token a word; trimmed to the target below
            words += rng.choice(sentences).split()
        text = " ".join(words)
        while count([text])[0] > target:
            words = words[: -max(1, (count([text])[0] - target) // 2)]
            text = " ".join(words)
        long_texts.append(text)
    short = [s for s, n in zip(sentences, count(sentences), strict=True) if 28 <= n <= 36]
    mixes = {"a": long_texts, "b": sentences, "c": short[:512]}
    return {load: list(zip(texts, count(texts), strict=True)) for load, texts in mixes.items()}


def requests_for(
    load: str, texts: list[tuple[str, int]], flops_of: Any, path: str, n: int
) -> list[loadgen.Request]:
    """``n`` requests of the load's size, cycling through its texts."""
    per, _ = LOADS[load]
    out = []
    for i in range(n):
        chunk = [texts[(i * per + j) % len(texts)] for j in range(per)]
        body = {"model": MODEL_NAME, "input": [t for t, _ in chunk], "encoding_format": "float"}
        tokens = sum(c for _, c in chunk)
        work = sum(flops_of(c) for _, c in chunk)
        out.append(loadgen.Request(path, body, per, tokens, "embed", work))
    return out


# --- the device -------------------------------------------------------------------------


def gemm_tflops(device: str) -> float:
    """A bf16 8192^3 matmul's rate on CUDA (the mean of 10 after 3 warm-ups); fp32 1024^3
    on the CPU smoke run."""
    import torch

    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    del a, b
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * n**3 * 10 / elapsed / 1e12


def device_facts(device: str) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cuda":
        facts["gpu"] = torch.cuda.get_device_name()
        facts["peak_bf16_tflops"] = next(
            (v for k, v in DENSE_BF16_TFLOPS.items() if k in facts["gpu"]), None
        )
        try:
            import pynvml

            pynvml.nvmlInit()
            facts["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception as exc:  # NVML missing: the run still measures
            facts["driver"] = f"unknown ({type(exc).__name__})"
    else:
        facts["gpu"] = "none (CPU smoke run)"
    return facts


class GpuSampler:
    """utilization.gpu every ``period`` seconds on a thread, while a load runs."""

    def __init__(self, device: str, period: float = 0.05) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._handle = None
        if device == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            except Exception:  # no NVML: busy share not reported
                self._handle = None
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)

    def _run(self, period: float) -> None:
        import pynvml

        while not self._stop.wait(period):
            self.samples.append(pynvml.nvmlDeviceGetUtilizationRates(self._handle).gpu / 100)

    def __enter__(self) -> GpuSampler:
        if self._handle is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    @property
    def busy(self) -> float | None:
        return round(sum(self.samples) / len(self.samples), 3) if self.samples else None


# --- servers ----------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    argv: list[str]
    env: dict[str, str]
    ready: str
    path: str


def ember(python: str, model: Path, device: str, dtype: str, extra: Sequence[str]) -> Server:
    port = bench_run.free_port()
    argv = [
        python, "-m", "ember", "serve", "--model-id", str(model),
        "--served-model-name", MODEL_NAME, "--device", device, "--dtype", dtype,
        "--host", HOST, "--port", str(port), "--log-level", "warning", *extra,
    ]  # fmt: skip
    return Server("ember", argv, {}, f"http://{HOST}:{port}/ready", "/v1/embeddings")


def infinity(python: str, model: Path, device: str, dtype: str) -> Server:
    port = bench_run.free_port()
    argv = [
        python, "-c", "from infinity_emb.cli import cli; cli()", "v2",
        "--model-id", str(model), "--served-model-name", MODEL_NAME, "--engine", "torch",
        "--device", device, "--dtype", dtype, "--host", HOST, "--port", str(port),
        "--log-level", "warning", "--no-model-warmup",
    ]  # fmt: skip
    env = {"DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    return Server("infinity", argv, env, f"http://{HOST}:{port}/health", "/embeddings")


def start(server: Server, pythonpath: str, log: Path, timeout_s: float) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": pythonpath,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "true",
        **server.env,
    }
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            server.argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{server.name} exited {proc.returncode}: {tail(log)}")
        try:
            if httpx.get(server.ready, timeout=2, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    bench_run.stop(proc)
    raise RuntimeError(f"{server.name} not ready in {timeout_s:.0f} s: {tail(log)}")


def tail(log: Path) -> str:
    lines = log.read_text(errors="replace").strip().splitlines() if log.exists() else []
    return " | ".join(lines[-3:])[-600:]


def stage_sums(base_url: str) -> dict[str, tuple[float, float]]:
    """Ember's ``ember_stage_seconds`` (sum, count) per stage, read off /metrics."""
    text = httpx.get(base_url + "/metrics", timeout=10, trust_env=False).text
    out: dict[str, list[float]] = {}
    pattern = r'ember_stage_seconds_(sum|count)\{[^}]*stage="(\w+)"[^}]*\} ([0-9.e+-]+)'
    for kind, stage, value in re.findall(pattern, text):
        pair = out.setdefault(stage, [0.0, 0.0])
        pair[0 if kind == "sum" else 1] += float(value)
    return {stage: (v[0], v[1]) for stage, v in out.items()}


# --- loads ------------------------------------------------------------------------------


def _client(
    base_url: str, load: str, texts: list[tuple[str, int]], shape: Any, path: str,
    offset: int, clients: int, seconds: float,
) -> loadgen.LoadResult:  # fmt: skip
    """One client process: the load's requests (built here, serialised once), sent round
    and round for ``seconds``."""
    reqs = requests_for(load, texts[offset:] + texts[:offset], shape.flops, path, 64)
    return asyncio.run(
        loadgen.run_load(
            base_url, reqs, name=load, concurrency=clients, time_limit_s=seconds, cycle=True
        )
    )


def drive(
    base_url: str, load: str, texts: list[tuple[str, int]], shape: Any, path: str,
    seconds: float, procs: int,
) -> loadgen.LoadResult:  # fmt: skip
    """The load's clients for ``seconds``, spread over ``procs`` client processes."""
    clients = LOADS[load][1]
    procs = max(1, min(procs, clients))
    share = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    with ProcessPoolExecutor(procs) as pool:
        parts = [
            pool.submit(_client, base_url, load, texts, shape, path, i * 7, n, seconds)
            for i, n in enumerate(share)
        ]
        return loadgen.merge_results([p.result() for p in parts])


def measure(
    server: Server,
    base_url: str,
    load: str,
    texts: list[tuple[str, int]],
    shape: Any,
    args: argparse.Namespace,
    gemm: float,
    peak: float | None,
) -> Row:
    def run(seconds: float) -> loadgen.LoadResult:
        return drive(base_url, load, texts, shape, server.path, seconds, args.client_procs)

    run(args.warmup_seconds)
    before = stage_sums(base_url) if server.name == "ember" else {}
    with GpuSampler(args.device) as gpu:
        result = run(args.seconds)
    after = stage_sums(base_url) if server.name == "ember" else {}
    row = Row(server.name, load)
    wall = result.wall_s or 1e-9
    row.requests_per_s = round(result.ok / wall, 1)
    row.inputs_per_s = round(result.items / wall, 1)
    row.tokens_per_s = round(result.tokens / wall, 1)
    row.p50_ms, row.p99_ms = round(result.latency_ms(50), 2), round(result.latency_ms(99), 2)
    row.errors, row.error_samples = result.errors, result.error_samples
    row.gpu_busy = gpu.busy
    row.tflops = round(result.flops / wall / 1e12, 3)
    row.frac_gemm = round(row.tflops / gemm, 4) if gemm else 0.0
    row.frac_peak = round(row.tflops / peak, 4) if peak else None
    for stage in STAGES:
        if stage in after:
            s0, n0 = before.get(stage, (0.0, 0.0))
            s1, n1 = after[stage]
            if n1 > n0:
                row.stages_ms[stage] = round((s1 - s0) / (n1 - n0) * 1000, 3)
    if result.ok == 0:
        row.status = f"no answer: {'; '.join(result.error_samples[:2]) or 'no request completed'}"
    return row


def bars(rows: Sequence[Row]) -> dict[str, Any]:
    """The issue's bars, each with what was measured (None: not measured in this run)."""
    by = {(r.server, r.load): r for r in rows if r.status == "ok"}
    a, b, c = (by.get(("ember", x)) for x in "abc")
    out: dict[str, Any] = {
        "a_frac_gemm_ge_0.35": a.frac_gemm if a else None,
        "b_tokens_ge_0.8x_a": round(b.tokens_per_s / a.tokens_per_s, 3) if a and b else None,
        "c_p99_le_50ms": c.p99_ms if c else None,
        "a_gpu_busy_ge_0.9": a.gpu_busy if a else None,
    }
    for load in LOADS:
        ours, theirs = by.get(("ember", load)), by.get(("infinity", load))
        key = f"{load}_ember_ge_2x_infinity"
        out[key] = round(ours.tokens_per_s / theirs.tokens_per_s, 3) if ours and theirs else None
    return out


def met(name: str, value: float | None) -> str:
    if value is None:
        return "not measured"
    limit = float(re.search(r"(ge|le)_([0-9.]+)", name).group(2))  # type: ignore[union-attr]
    ok = value >= limit if "_ge_" in name else value <= limit
    return "met" if ok else "not met"


def markdown(result: dict[str, Any]) -> str:
    f = result["facts"]
    lines = [
        f"# Device run: Ember vs Infinity (torch) on {f['gpu']} ({result['date']})",
        "",
        f"torch {f['torch']} (CUDA {f['cuda']}), driver {f.get('driver', '-')}; model "
        f"{result['model']}; dtype {result['dtype']}; {result['seconds']} s per load after "
        f"{result['warmup_seconds']} s of warm-up; client: loadgen in "
        f"{result['client_procs']} processes. Measured GEMM (bf16 on CUDA, fp32 on CPU) "
        f"{result['gemm_tflops']:.3g} TFLOP/s; data-sheet peak "
        f"{f.get('peak_bf16_tflops') or '-'} TFLOP/s.",
        "",
        "| server | load | status | tokens/s | inputs/s | req/s | p50 ms | p99 ms | GPU busy "
        "| TFLOP/s | of GEMM | of peak | tokenize / queue / forward / serialize ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["rows"]:
        stages = " / ".join(str(r["stages_ms"].get(s, "-")) for s in STAGES)
        busy = "-" if r["gpu_busy"] is None else f"{r['gpu_busy']:.0%}"
        peak = "-" if r["frac_peak"] is None else f"{r['frac_peak']:.1%}"
        lines.append(
            f"| {r['server']} | {r['load']} | {r['status']} | {r['tokens_per_s']:,.0f} | "
            f"{r['inputs_per_s']:,.0f} | {r['requests_per_s']:,.0f} | {r['p50_ms']} | "
            f"{r['p99_ms']} | {busy} | {r['tflops']} | {r['frac_gemm']:.1%} | {peak} | "
            f"{stages} |"
        )
    lines += ["", "| bar | measured | |", "| --- | --- | --- |"]
    for name, value in result["bars"].items():
        lines.append(f"| {name} | {value if value is not None else '-'} | {met(name, value)} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--dtype", default=None, help="default: float16 on CUDA, float32 on CPU")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide network (smoke)")
    p.add_argument("--seconds", type=float, default=30.0, help="measured, per load and server")
    p.add_argument("--warmup-seconds", type=float, default=4.0)
    p.add_argument("--loads", default="a,b,c")
    p.add_argument("--tokenizer", type=Path, required=True, help="bert-base-uncased's files")
    p.add_argument("--ember-path", default="", help="PYTHONPATH entries before core/ for Ember")
    p.add_argument("--infinity-path", default=None, help="PYTHONPATH for Infinity; unset: not run")
    p.add_argument("--ember-arg", action="append", default=[], help="extra `ember serve` flag")
    p.add_argument("--client-procs", type=int, default=4)
    p.add_argument("--start-timeout", type=float, default=240.0)
    p.add_argument("--out", type=Path, required=True, help="folder for the model and results")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("float16" if args.device == "cuda" else "float32")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    model = args.out / "bge-base-shaped"
    if not (model / "modules.json").exists():
        build_env = {**os.environ, "PYTHONPATH": args.infinity_path or os.pathsep.join(sys.path)}
        cmd = [python, str(REPO / "benchmarks" / "device_model.py"), str(model),
               "--tokenizer", str(args.tokenizer), *(["--tiny"] if args.tiny else [])]  # fmt: skip
        subprocess.run(cmd, env=build_env, check=True, timeout=300, capture_output=True)
    shape = model_shape(model)
    texts = load_texts(args.tokenizer / "tokenizer.json")
    facts = device_facts(args.device)
    gemm = gemm_tflops(args.device)
    peak = facts.get("peak_bf16_tflops")
    print(f"GEMM {gemm:.3g} TFLOP/s; {facts}", flush=True)
    ember_path = os.pathsep.join(p for p in (args.ember_path, str(REPO / "core"), str(REPO)) if p)
    servers = [(ember(python, model, args.device, args.dtype, args.ember_arg), ember_path)]
    if args.infinity_path is not None:
        servers.append((infinity(python, model, args.device, args.dtype), args.infinity_path))
    rows: list[Row] = []
    loads = [x for x in args.loads.split(",") if x]
    for server, pythonpath in servers:
        log = args.out / f"{server.name}.log"
        try:
            proc = start(server, pythonpath, log, args.start_timeout)
        except Exception as exc:  # reported in the results; the other server still runs
            rows += [Row(server.name, load, status=f"did not start: {exc}") for load in loads]
            continue
        base_url = server.ready.rsplit("/", 1)[0]
        try:
            for load in loads:
                row = measure(server, base_url, load, texts[load], shape, args, gemm, peak)
                print(json.dumps(asdict(row)), flush=True)
                rows.append(row)
        finally:
            bench_run.stop(proc)
    result = {
        "date": dt.date.today().isoformat(),
        "facts": facts,
        "model": "BERT-base (bge-base-en-v1.5's shape)" if not args.tiny else "tiny BERT",
        "dtype": args.dtype,
        "seconds": args.seconds,
        "warmup_seconds": args.warmup_seconds,
        "client_procs": args.client_procs,
        "gemm_tflops": round(gemm, 2),
        "rows": [asdict(r) for r in rows],
        "bars": bars(rows),
        "command": " ".join(["benchmarks/device_bench.py", *(argv or sys.argv[1:])]),
    }
    text = markdown(result)
    print(text)
    (args.out / "device.json").write_text(json.dumps(result, indent=2))
    (args.out / "device.md").write_text(text)
    return 0 if all(r.status == "ok" and not r.errors for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
