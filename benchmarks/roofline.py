"""The machine's GEMM roofline at the model's shapes, and each tier's share of it.

Why at the model's shapes: a square 2048³ GEMM runs near the CPU's peak, while MiniLM's
matmuls are [tokens × 384] × [384 × 384 | 1152 | 1536] and [tokens × 1536] × [1536 × 384],
which a 2-core CPU runs measurably slower. The roofline of a tier is the best rate its
number format reaches on exactly those matmuls (fp32, bf16, int8 with int32 sums), with as
many threads as cores, divided by the model FLOPs per sentence (``benchmarks/flops.py``):
the sentences/s a server would reach if everything but the GEMMs were free.

Each results file of ``run.py`` records the CPU (``lscpu`` model name and flags) beside its
rooflines, so ``python benchmarks/roofline.py`` prints every tier's share per CPU kind seen
in ``benchmarks/results/``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
# The flags that decide which number formats a CPU multiplies natively.
KEY_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
FORMATS = ("float32", "bfloat16", "int8")


def cpu_kind() -> dict[str, Any]:
    """``lscpu``'s model name and flags (all of them, and the ones that pick a format)."""
    fields: dict[str, str] = {}
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    flags = fields.get("Flags", "").split()
    if not flags:  # no lscpu: the kernel's view
        try:
            text = Path("/proc/cpuinfo").read_text()
            flags = next(
                (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")),
                [],
            )
        except OSError:
            flags = []
    return {
        "model_name": fields.get("Model name", "unknown CPU"),
        "key_flags": [f for f in KEY_FLAGS if f in flags],
        "flags": " ".join(flags),
    }


def model_matmuls(d_model: int, d_ff: int, tokens: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of one encoder layer's weight matmuls for a batch of ``tokens`` tokens."""
    return [
        (tokens, d_model, 3 * d_model),  # Q, K, V
        (tokens, d_model, d_model),  # attention output
        (tokens, d_model, d_ff),  # FFN in
        (tokens, d_ff, d_model),  # FFN out
    ]


def gemm_rate(
    fmt: str, shapes: Iterable[tuple[int, int, int]], threads: int, seconds: float = 2.0
) -> float:
    """Best GFLOP/s over the layer's matmuls run back to back (each shape's best time,
    summed), in ``fmt``, with ``threads`` threads; bounded by ``seconds`` per shape."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flops = total = 0.0
        for m, k, n in shapes:
            if fmt == "int8":
                a = torch.randint(-127, 127, (m, k), dtype=torch.int8)
                b = torch.randint(-127, 127, (k, n), dtype=torch.int8)

                def mm(a: Any = a, b: Any = b) -> Any:
                    return torch._int_mm(a, b)  # int8 x int8 -> int32: VNNI / AMX-INT8
            else:
                dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[fmt]
                a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)

                def mm(a: Any = a, b: Any = b) -> Any:
                    return torch.mm(a, b)

            mm()
            best, end, runs = math.inf, time.perf_counter() + seconds, 0
            while runs < 10_000 and (runs < 3 or time.perf_counter() < end):
                t0 = time.perf_counter()
                mm()
                best = min(best, time.perf_counter() - t0)
                runs += 1
            flops += 2.0 * m * k * n
            total += best
        return flops / total / 1e9
    finally:
        torch.set_num_threads(old)


def measure(
    d_model: int, d_ff: int, flops_per_sentence: float, tokens: int = 2048, threads: int = 0
) -> dict[str, Any]:
    """The rooflines of this machine for the model: GFLOP/s and sentences/s per format."""
    threads = threads or os.cpu_count() or 1
    shapes = model_matmuls(d_model, d_ff, tokens)
    out: dict[str, Any] = {"threads": threads, "tokens_per_gemm": tokens, "formats": {}}
    for fmt in FORMATS:
        try:
            gflops = gemm_rate(fmt, shapes, threads)
        except (RuntimeError, NotImplementedError) as exc:  # a torch build without the kernel
            out["formats"][fmt] = {"error": str(exc).splitlines()[0][:200]}
            continue
        out["formats"][fmt] = {
            "gflops": round(gflops, 1),
            "sent_per_s": round(gflops * 1e9 / flops_per_sentence, 1),
        }
    return out


def best_of(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Per format, the faster of two measurements (start and end of a run): on a shared
    host the slower one measured the other processes, not the CPU."""
    formats = {}
    for fmt in FORMATS:
        runs = [r["formats"].get(fmt, {}) for r in (first, second)]
        ok = [x for x in runs if "gflops" in x]
        formats[fmt] = max(ok, key=lambda x: x["gflops"]) if ok else runs[0]
    return {**first, "formats": formats, "measured": "best of the run's start and end"}


def tier_format(row: dict[str, Any]) -> str:
    """Which number format a served row computes its GEMMs in (its roofline)."""
    dtype = str(row.get("served_dtype") or "")
    name = str(row.get("server", ""))
    for fmt in ("int8", "bfloat16"):
        if fmt in dtype or fmt in name:
            return fmt
    return "float32"


def shares(rows: list[dict[str, Any]], roofline: dict[str, Any], load: str = "a") -> None:
    """Add each row's sentences/s at ``load`` as a share of its own format's roofline."""
    formats = roofline.get("formats", {})
    for r in rows:
        rate = r.get("loads", {}).get(load, {}).get("items_per_s")
        if not rate:
            continue
        fmt = tier_format(r)
        r["roofline_format"] = fmt
        top = formats.get(fmt, {}).get("sent_per_s")
        r["roofline_share"] = round(rate / top, 3) if top else None
        r["fp32_roofline_share"] = (
            round(rate / formats["float32"]["sent_per_s"], 3)
            if formats.get("float32", {}).get("sent_per_s")
            else None
        )


def markdown(roofline: dict[str, Any], rows: list[dict[str, Any]], cpu: dict[str, Any]) -> str:
    """The roofline section of a results file."""
    formats = roofline.get("formats", {})
    lines = [
        f"## Roofline — {cpu.get('model_name')} ({', '.join(cpu.get('key_flags', [])) or '-'})",
        "",
        f"GEMM at the model's shapes ({roofline.get('tokens_per_gemm')} tokens × each layer "
        f"matmul), {roofline.get('threads')} threads: "
        + ", ".join(
            f"{fmt} {v['gflops']:.0f} GFLOP/s = {v['sent_per_s']:.0f} sent/s"
            if "gflops" in v
            else f"{fmt} unavailable ({v.get('error')})"
            for fmt, v in formats.items()
        )
        + ".",
        "",
        "| server | (a) sent/s | its format | share of its roofline | share of the fp32 roofline |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if "roofline_share" not in r:
            continue
        rate = r["loads"]["a"]["items_per_s"]
        share, fp32 = (_pct(r.get(k)) for k in ("roofline_share", "fp32_roofline_share"))
        lines.append(f"| {r['server']} | {rate:.1f} | {r['roofline_format']} | {share} | {fp32} |")
    return "\n".join(lines) + "\n"


def _pct(share: float | None) -> str:
    return "–" if share is None else f"{share:.0%}"


def report(results: Path = RESULTS) -> str:
    """Every results file with a roofline, grouped by CPU kind (model name + key flags)."""
    kinds: dict[str, list[str]] = {}
    for path in sorted(results.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        meta = data.get("meta", {}) if isinstance(data, dict) else {}
        if "roofline" not in meta or "cpu_kind" not in meta:
            continue
        cpu = meta["cpu_kind"]
        key = f"{cpu.get('model_name')} [{', '.join(cpu.get('key_flags', []))}]"
        table = markdown(meta["roofline"], data.get("rows", []), cpu).split("\n", 2)[2]
        kinds.setdefault(key, []).append(
            f"### {path.name} (load average {meta.get('loadavg_start')})\n\n{table}"
        )
    if not kinds:
        return "no results file with a roofline yet (benchmarks/run.py writes one)\n"
    return "\n".join(f"## {kind}\n\n" + "\n".join(parts) for kind, parts in kinds.items())


if __name__ == "__main__":
    sys.stdout.write(report(Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS))
