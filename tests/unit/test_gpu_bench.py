"""benchmarks/gpu_bench.py runs on CPU with a tiny model: the same code the GPU run uses."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from benchmarks import gpu_bench

REPO = Path(__file__).resolve().parents[2]


def test_planned_batches_hold_every_text_once_within_limits() -> None:
    texts = gpu_bench.token_mix("64", 300, 1000, random.Random(1))
    batches = gpu_bench.plan_batches(texts, "cuda", max_tokens=4096, max_size=64)
    lengths = sorted(int(n) for b in batches for n in b.attention_mask.sum(axis=1))
    assert lengths == sorted(len(t) for t in texts)
    assert all(b.input_ids.size <= 4096 and b.input_ids.shape[0] <= 64 for b in batches)
    assert all(16 <= len(t) <= 112 for t in texts)


def test_cpu_smoke_run(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'core'}:{REPO}"}
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "gpu_bench.py"),
        "--device",
        "cpu",
        "--tiny",
        "--sequences",
        "24",
        "--repeats",
        "1",
        "--json",
        str(out),
        "--paths",
        "torch:float32,onnx:float32,onnx:float16",
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {(r["path"], r["mix"]): r for r in report["rows"]}
    assert set(rows) == {
        (p, m) for p in ("torch:float32", "onnx:float32", "onnx:float16") for m in ("64", "512")
    }
    for path in ("torch:float32", "onnx:float32"):
        for mix in ("64", "512"):
            row = rows[path, mix]
            assert row["status"] == "ok" and row["tokens_per_s"] > 0 and row["tflops"] > 0
            assert 0 <= row["padding_share"] < 0.5 and row["runs_on"]
    # fp16 ONNX needs CUDA: the row says why it did not run instead of failing the report.
    assert rows["onnx:float16", "64"]["status"].startswith("not run:")
    assert "cuda" in rows["onnx:float16", "64"]["status"]
    assert "| torch:float32 | 512 |" in done.stdout
