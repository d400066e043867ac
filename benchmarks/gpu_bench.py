"""Accelerator throughput of Ember's torch and ONNX paths on a bge-base-size encoder.

Why random weights: speed does not depend on the values, and no model hub is reachable
where this runs. The model is BERT-base as bge-base-en-v1.5 ships it (768 wide, 12 layers,
12 heads, 3072 FFN, 512 positions, CLS pooling), built from its config with seeded weights
and loaded through Ember's own backends, the code `ember serve` runs. Two length mixes of
random token ids: "64" (16-112 tokens, mean 64) and "512" (384-512 tokens). Batches are
cut by the engine's planner (`take_batch`) with everything waiting at once, as a saturated
server cuts them, with the accelerator's padding slack.

Reported per path and mix: real (unpadded) tokens/s, the padding share, model TFLOP/s
(benchmarks/flops.py: useful work on real tokens only), and that as a fraction of (a) a
bf16 GEMM measured in the same run and (b) the device's dense bf16 peak from its data
sheet (--peak-tflops, else a small table by device name).

    bash benchmarks/gpu.sh                                   # CUDA, the full run
    PYTHONPATH=core:. python benchmarks/gpu_bench.py --device cpu --tiny   # smoke
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "core"), str(REPO)]

from benchmarks.device_model import BGE_BASE  # noqa: E402
from benchmarks.flops import ModelShape, model_shape  # noqa: E402
from ember.backends.base import Backend  # noqa: E402
from ember.batch import TokenBatch, Tokens  # noqa: E402
from ember.engine.batcher import WorkItem, padding_budget_for, take_batch  # noqa: E402
from ember.processors.text import collate  # noqa: E402

TINY = {
    **BGE_BASE,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
MIXES = {"64": (16, 112), "512": (384, 512)}
# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's data sheets, TFLOP/s.
DENSE_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0}
CLS, SEP, FIRST_WORD = 101, 102, 999


@dataclass
class Row:
    path: str
    mix: str
    status: str  # "ok" or why the path did not run
    runs_on: str = ""  # attention kernel (torch) or execution providers (onnx)
    tokens_per_s: float = 0.0
    padding_share: float = 0.0
    tflops: float = 0.0
    frac_gemm: float = 0.0
    frac_peak: float = 0.0


def build_model(root: Path, config: dict[str, int], seed: int = 0) -> Path:
    """A sentence-transformers directory (weights, config, CLS pooling, a tokenizer)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    BertModel(BertConfig(**config)).eval().save_pretrained(root)
    vocab = {"[PAD]": 0, "[UNK]": 100, "[CLS]": CLS, "[SEP]": SEP}
    vocab.update({f"w{i}": i for i in range(FIRST_WORD, config["vocab_size"])})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(root / "tokenizer.json"))
    (root / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ]
        )
    )
    (root / "1_Pooling").mkdir()
    (root / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {"word_embedding_dimension": config["hidden_size"], "pooling_mode_cls_token": True}
        )
    )
    return root


def token_mix(mix: str, count: int, vocab: int, rng: random.Random) -> list[Tokens]:
    lo, hi = MIXES[mix]
    out = []
    for _ in range(count):
        n = rng.randint(lo, hi) - 2
        ids = [CLS, *(rng.randrange(FIRST_WORD, vocab) for _ in range(n)), SEP]
        out.append(Tokens(ids, [0] * len(ids)))
    return out


def plan_batches(
    texts: list[Tokens], device: str, max_tokens: int, max_size: int
) -> list[TokenBatch]:
    """The engine planner's batches for a queue holding every text at once."""
    waiting = [WorkItem(t, None) for t in texts]  # type: ignore[arg-type]  # no future needed
    out = []
    while waiting:
        batch, waiting = take_batch(waiting, max_tokens, max_size, padding_budget_for(device))
        out.append(collate([it.item for it in batch], pad_id=0))
    return out


def gemm_peak_tflops(device: str) -> float:
    """Mean bf16 (fp32 on CPU) GEMM rate after warm-up: the achievable-peak denominator."""
    import torch

    n, dtype = (8192, torch.bfloat16) if device == "cuda" else (1024, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def load(model_dir: Path, path: str, device: str, cache: Path) -> Backend:
    from ember.backends import load_backend
    from ember.families.resolve import resolve_model
    from ember.models.spec import ModelSpec

    backend, dtype = path.split(":")
    spec = ModelSpec(
        model_id=str(model_dir), backend=backend, device=device, dtype=dtype, cache_dir=cache
    )
    return load_backend(resolve_model(spec))


def measure(
    backend: Backend, batches: list[TokenBatch], shape: ModelShape, repeats: int
) -> tuple[float, float, float]:
    """(real tokens/s, padding share, model TFLOP/s) of the fastest of ``repeats`` passes."""
    lengths = [int(n) for b in batches for n in b.attention_mask.sum(axis=1)]
    real, padded = sum(lengths), sum(b.input_ids.size for b in batches)
    work = sum(shape.flops(n) for n in lengths)
    for batch in sorted(batches, key=lambda b: b.input_ids.size)[-2:] + batches[:2]:
        backend.forward(batch)  # warm-up: the largest shapes and a few others
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for batch in batches:
            backend.forward(batch)  # returns host numpy: the copy back is included
        best = min(best, time.perf_counter() - t0)
    return real / best, 1 - real / padded, work / best / 1e12


def device_peak(device: str, given: float | None) -> float | None:
    if given or device != "cuda":
        return given
    import torch

    name = torch.cuda.get_device_name()
    return next((v for k, v in DENSE_BF16_TFLOPS.items() if k in name), None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--paths", default=None, help="backend:dtype,... (default per device)")
    p.add_argument("--tiny", action="store_true", help="a 2-layer model: a smoke run")
    p.add_argument("--sequences", type=int, default=4096, help="texts per mix")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-batch-tokens", type=int, default=65536)
    p.add_argument("--max-batch-size", type=int, default=256)
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    default_paths = (
        "torch:float16,torch:bfloat16,onnx:float16"
        if args.device == "cuda"
        else ("torch:float32,onnx:float32")
    )
    paths = (args.paths or default_paths).split(",")
    config = TINY if args.tiny else BGE_BASE
    rng = random.Random(0)
    gemm = gemm_peak_tflops(args.device)
    peak = device_peak(args.device, args.peak_tflops)
    print(f"device {args.device}; measured GEMM {gemm:.1f} TFLOP/s; data-sheet peak {peak}")
    print("| path | mix | runs on | tokens/s | padding | TFLOP/s | of GEMM | of peak | status |")
    print("|---|---|---|---|---|---|---|---|---|", flush=True)
    rows: list[Row] = []

    def report(row: Row) -> None:
        """Each row as soon as it is measured: a later failure or timeout keeps it."""
        rows.append(row)
        print(
            f"| {row.path} | {row.mix} | {row.runs_on} | {row.tokens_per_s:,.0f} | "
            f"{row.padding_share:.1%} | {row.tflops:.2f} | {row.frac_gemm:.1%} | "
            f"{row.frac_peak:.1%} | {row.status} |",
            flush=True,
        )
        if args.json:
            body = {"gemm_tflops": gemm, "peak_tflops": peak, "rows": [asdict(r) for r in rows]}
            args.json.write_text(json.dumps(body, indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", config)
        shape = model_shape(model_dir)
        mixes = {m: token_mix(m, args.sequences, config["vocab_size"], rng) for m in MIXES}
        for path in paths:
            try:
                backend = load(model_dir, path, args.device, Path(tmp) / "cache")
            except Exception as exc:  # a path that cannot load says why; the others still run
                for mix in MIXES:
                    report(Row(path, mix, f"not run: {type(exc).__name__}: {exc}"))
                continue
            details = backend.info.details
            runs_on = details.get("attention") or details.get("providers", "")
            if args.device == "cuda" and path.startswith("onnx") and "CUDA" not in runs_on:
                # onnxruntime fell back to the CPU provider: hours of fp16 work on a CPU.
                for mix in MIXES:
                    report(Row(path, mix, f"not run: no CUDA provider loaded ({runs_on})"))
                backend.close()
                continue
            for mix, texts in mixes.items():
                batches = plan_batches(
                    texts, args.device, args.max_batch_tokens, args.max_batch_size
                )
                try:
                    tps, pad, tflops = measure(backend, batches, shape, args.repeats)
                except Exception as exc:  # e.g. out of memory at the 512 mix
                    report(Row(path, mix, f"failed: {type(exc).__name__}: {exc}", runs_on))
                    continue
                frac_peak = tflops / peak if peak else 0.0
                report(Row(path, mix, "ok", runs_on, tps, pad, tflops, tflops / gemm, frac_peak))
            backend.close()


if __name__ == "__main__":
    main()
