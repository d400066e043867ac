"""The prepared device run (benchmarks/device.sh) and the front-end benchmark run on CPU:
the same scripts a GPU machine runs, Ember only, a tiny network, a second per load. What
is checked is that every load is answered in full and reported, never how fast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import device_bench

REPO = Path(__file__).resolve().parents[2]


def test_device_sh_smoke_runs_every_load_and_reports_the_bars(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable}
    run = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "device.sh"), "--smoke"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads((tmp_path / "device.json").read_text())
    rows = {(r["server"], r["load"]): r for r in result["rows"]}
    assert set(rows) == {("ember", "a"), ("ember", "b"), ("ember", "c")}
    for row in rows.values():
        assert row["status"] == "ok" and row["errors"] == 0
        assert row["requests_per_s"] > 0 and row["tokens_per_s"] > 0
        assert set(row["stages_ms"]) >= {"tokenize", "queue", "forward"}
    # a's inputs are 384-512 tokens, c's about 32: the rows count real tokens
    assert 384 <= rows["ember", "a"]["tokens_per_s"] / rows["ember", "a"]["inputs_per_s"] <= 512
    assert 28 <= rows["ember", "c"]["tokens_per_s"] / rows["ember", "c"]["inputs_per_s"] <= 36
    assert result["bars"]["a_ember_ge_2x_infinity"] is None  # Infinity was not run
    assert "| bar | measured |" in (tmp_path / "device.md").read_text()
    # sentence-transformers' own save, CLS pooling then Normalize, as bge-base ships it
    modules = json.loads((tmp_path / "bge-base-shaped" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == [
        "Transformer",
        "Pooling",
        "Normalize",
    ]


def test_the_device_loads_are_the_issues() -> None:
    assert device_bench.LOADS == {"a": (16, 8), "b": (32, 8), "c": (1, 64)}


@pytest.mark.parametrize(
    ("name", "value", "verdict"),
    [
        ("a_frac_gemm_ge_0.35", 0.36, "met"),
        ("a_frac_gemm_ge_0.35", 0.2, "not met"),
        ("c_p99_le_50ms", 49.0, "met"),
        ("c_p99_le_50ms", 51.0, "not met"),
        ("b_ember_ge_2x_infinity", None, "not measured"),
    ],
)
def test_bars_are_judged_by_their_own_limits(name: str, value: float | None, verdict: str) -> None:
    assert device_bench.met(name, value) == verdict


def test_frontend_benchmark_smoke(tmp_path: Path) -> None:
    """benchmarks/frontend.py: Ember and the bare stack answer the same vectors, both loads
    run against both, with the aiohttp client (wrk is not a test dependency)."""
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'core'}:{REPO}"}
    out = tmp_path / "frontend"
    static = tmp_path / "static"
    cmd = [sys.executable, str(REPO / "benchmarks" / "frontend.py"), "--quick",
           "--client", "aiohttp", "--static", str(static), "--out", str(out)]  # fmt: skip
    from benchmarks import corpus
    from benchmarks.static_served import build_static

    tokenizer = corpus.default_tokenizer_path()
    assert tokenizer is not None
    build_static(static, tokenizer)
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["worst_cosine_ember_vs_floor"] >= 0.9999
    rows = {(r["server"], r["load"]): r for r in result["rows"]}
    assert set(rows) == {(s, load) for s in ("ember", "floor") for load in ("one", "many")}
    assert all(r["requests_per_s"] > 0 and r["errors"] == 0 for r in rows.values())
    assert set(result["ember_share_of_floor"]) == {"one", "many"}
