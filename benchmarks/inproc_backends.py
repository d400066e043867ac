"""In-process backend throughput and fidelity on the packaged all-MiniLM-L6-v2.

Why in-process: it isolates the forward pass (what a backend choice changes) from HTTP,
queueing and tokenisation. The corpus is ``benchmarks/corpus.py``'s deterministic
2,048 sentences of 8-120 words, tokenised once, sorted by length and cut into batches
of 32 (as the engine's batcher does). For each backend/dtype: load (building the
artifact on first use, not timed), one warm-up pass, then ``--repeats`` timed passes;
sentences/s is reported from the fastest pass (least disturbed by other processes) and
the median. Fidelity: cosine of every sentence against sentence-transformers fp32.

    PYTHONPATH=core:. .venv/bin/python benchmarks/inproc_backends.py
    PYTHONPATH=core:. .venv/bin/python benchmarks/inproc_backends.py --only onnx:int8 ct2:int8

``openvino:bfloat16`` and ``openvino:int8`` load the paths ``auto`` serves (the near-exact
default, the fast tier) directly; ``--backend openvino`` is not a server flag.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "core"), str(REPO)]

from benchmarks.corpus import make_sentences  # noqa: E402
from ember.backends import load_backend  # noqa: E402
from ember.backends.base import Backend  # noqa: E402
from ember.backends.registry import backend_module  # noqa: E402
from ember.batch import TokenBatch  # noqa: E402
from ember.families.resolve import resolve_model  # noqa: E402
from ember.heads.dense import DenseHead  # noqa: E402
from ember.models.resolve import default_model_path  # noqa: E402
from ember.models.spec import ModelSpec, ResolvedModel  # noqa: E402
from ember.processors.text import TextTokenizer, collate  # noqa: E402

POOLING = "mean"  # all-MiniLM-L6-v2's
VARIANTS = ("torch:float32", "onnx:float32", "onnx:int8", "ct2:float32", "ct2:int8")
AUTO_ONLY = "openvino"  # auto's paths, loaded by their module: no --backend names them


def batches(model: ResolvedModel, texts: list[str], size: int) -> tuple[list, list[int]]:
    """Length-sorted padded batches and the corpus order they hold."""
    tok = TextTokenizer(model)
    tokens = tok.encode(texts)
    order = sorted(range(len(texts)), key=lambda i: len(tokens[i]))
    out = [
        collate([tokens[i] for i in order[s : s + size]], tok.pad_id)
        for s in range(0, len(order), size)
    ]
    return out, order


def run_pass(
    backend: Backend, prepared: list[TokenBatch], pool: ThreadPoolExecutor | None
) -> tuple[np.ndarray, float, float]:
    """One pass over the corpus (forward and the dense head, as the engine runs them);
    batches run concurrently when the backend asks for it."""
    head = DenseHead(POOLING)

    def forward(batch: TokenBatch) -> np.ndarray:
        return np.stack(head.split(backend.forward(batch), batch, range(batch.shape[0])))

    wall, cpu = time.perf_counter(), time.process_time()
    results = pool.map(forward, prepared) if pool else map(forward, prepared)
    out = np.concatenate(list(results))
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=list(VARIANTS), help="backend:dtype ...")
    parser.add_argument("--cache-dir", type=Path, default=None, help="artifact cache")
    parser.add_argument(
        "--forward-workers",
        type=int,
        default=0,
        help="concurrent forwards (0: the backend's default, ember.cpu.cpu_forward_plan)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    args = parser.parse_args()

    cache = args.cache_dir or Path(tempfile.gettempdir()) / "ember-bench-cache"
    texts = make_sentences(args.n)
    path = default_model_path()

    from sentence_transformers import SentenceTransformer

    started = time.perf_counter()
    st = SentenceTransformer(str(path), device="cpu")
    reference = st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True)
    st_seconds = time.perf_counter() - started
    del st
    print(f"sentence-transformers fp32 reference: {args.n / st_seconds:.0f} sentences/s (1 pass)")

    rows = []
    for variant in args.only:
        backend_name, dtype = variant.split(":")
        spec = ModelSpec(
            model_id=str(path),
            backend="auto" if backend_name == AUTO_ONLY else backend_name,
            dtype=dtype,
            device="cpu",
            cache_dir=cache,
            forward_workers=args.forward_workers,
        )
        model = resolve_model(spec)
        t0 = time.perf_counter()
        if backend_name == AUTO_ONLY:
            backend = backend_module(AUTO_ONLY).load(model.on_backend(AUTO_ONLY, "cpu", dtype))
        else:
            backend = load_backend(model)
        load_s = time.perf_counter() - t0
        prepared, order = batches(model, texts, args.batch_size)
        workers = backend.parallel_forwards
        pool = ThreadPoolExecutor(workers) if workers > 1 else None
        run_pass(backend, prepared[:4], pool)  # warm-up: allocator, thread pools, kernels
        walls, cpus, out = [], [], None
        for _ in range(args.repeats):
            out, wall, cpu = run_pass(backend, prepared, pool)
            walls.append(wall)
            cpus.append(cpu)
        if pool:
            pool.shutdown()
        emb = np.empty_like(out)
        emb[np.asarray(order)] = out
        a = emb / np.linalg.norm(emb, axis=1, keepdims=True)
        b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
        cos = (a * b).sum(axis=1)
        row = {
            "variant": variant,
            "dtype": backend.info.dtype,
            "threads": backend.info.details.get("threads")
            or backend.info.details.get("forwards", "?"),
            "sent_per_s_best": round(args.n / min(walls), 1),
            "sent_per_s_median": round(args.n / statistics.median(walls), 1),
            "cpu_s_per_pass": round(min(cpus), 2),
            "cos_worst": round(float(cos.min()), 5),
            "cos_mean": round(float(cos.mean()), 5),
            "load_s": round(load_s, 1),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        backend.close()

    load1, load5, _ = os.getloadavg()
    print(
        f"\n{args.n} sentences, batches of {args.batch_size} sorted by length, "
        f"{args.repeats} timed passes, {os.cpu_count()} CPUs, loadavg {load1:.1f}/{load5:.1f}"
    )
    print(
        "| backend:dtype | forwards x threads | sentences/s (best) | (median) | CPU s/pass "
        "| cos worst | cos mean |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} ({r['dtype']}) | {r['threads']} | {r['sent_per_s_best']} | "
            f"{r['sent_per_s_median']} | {r['cpu_s_per_pass']} | {r['cos_worst']} | "
            f"{r['cos_mean']} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"n": args.n, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
