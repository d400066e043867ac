"""Smoke test of the benchmark harness: the corpus is deterministic and the load generator
counts what it sent. The server here is a fake (fixed vectors): it tests the load
generator, not any model."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from benchmarks import corpus, flops, loadgen


def test_corpus_is_deterministic_and_in_range() -> None:
    first = corpus.make_corpus()
    second = corpus.make_corpus()
    assert first == second
    assert len(first.sentences) == corpus.N_SENTENCES == 2048
    lengths = [corpus.word_count(s) for s in first.sentences]
    assert min(lengths) >= corpus.MIN_WORDS and max(lengths) <= corpus.MAX_WORDS
    assert min(lengths) < 15 and max(lengths) > 100  # the whole range is used
    assert len(set(first.sentences)) > 2000
    assert len(first.rerank_docs) == corpus.RERANK_DOCS == 32
    # A different seed gives a different corpus; a prefix of a smaller one is the same.
    assert corpus.make_sentences(8, seed=1) != corpus.make_sentences(8, seed=2)
    assert corpus.make_sentences(16)[:8] == corpus.make_sentences(8)


def test_percentile_matches_numpy() -> None:
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0]
    for q in (0, 25, 50, 90, 99, 100):
        assert loadgen.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_only_loopback_targets() -> None:
    loadgen.check_loopback("http://127.0.0.1:1")
    loadgen.check_loopback("http://127.3.2.1:1")
    loadgen.check_loopback("http://localhost:1")
    loadgen.check_loopback("http://[::1]:1")
    for url in ("http://10.0.0.1:80", "http://192.168.1.1", "http://example.com"):
        with pytest.raises(ValueError):
            loadgen.check_loopback(url)


def _fake_app() -> FastAPI:
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> JSONResponse:
        body = await request.json()
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if "FAIL" in texts:
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        await asyncio.sleep(0.002)
        data = [
            {"object": "embedding", "index": i, "embedding": [1.0, float(len(t)), 0.0, 0.5]}
            for i, t in enumerate(texts)
        ]
        return JSONResponse({"object": "list", "data": data, "model": body.get("model")})

    @app.post("/v1/rerank")
    async def rerank(request: Request) -> JSONResponse:
        body = await request.json()
        results = [
            {"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(len(body["documents"]))
        ]
        return JSONResponse({"results": results})

    return app


@pytest.fixture(scope="module")
def fake_server() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(_fake_app(), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.02)
    assert server.started
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=5)


def test_load_generator_counts(fake_server: str) -> None:
    texts = corpus.make_sentences(100)
    tokens = [corpus.word_count(t) + 2 for t in texts]  # any per-text number will do
    reqs = loadgen.embed_requests(texts, tokens, 32, path="/v1/embeddings", model="m")
    assert [r.items for r in reqs] == [32, 32, 32, 4]
    warm = loadgen.embed_requests(texts[:2], tokens[:2], 2, path="/v1/embeddings", model="m")
    result = asyncio.run(loadgen.run_load(fake_server, reqs, name="a", concurrency=4, warmup=warm))
    assert (result.planned, result.sent, result.ok, result.errors) == (4, 4, 4, 0)
    assert result.items == 100 and result.tokens == sum(tokens)
    assert len(result.latencies_ms) == 4 and not result.timed_out
    assert result.items_per_s == pytest.approx(100 / result.wall_s)
    summary = result.summary()
    assert summary["p50_ms"] == pytest.approx(np.percentile(result.latencies_ms, 50), abs=0.01)
    assert summary["p99_ms"] >= summary["p50_ms"] > 0


def test_load_generator_errors_and_rerank(fake_server: str) -> None:
    texts = ["ok one", "FAIL", "ok two", "FAIL", "ok three"]
    reqs = loadgen.embed_requests(texts, [3] * 5, 1, path="/v1/embeddings", model="m")
    result = asyncio.run(loadgen.run_load(fake_server, reqs, name="b", concurrency=2))
    assert (result.ok, result.errors, result.items, result.tokens) == (3, 2, 3, 9)
    assert result.error_samples[0].startswith("HTTP 500")

    docs = ["d1", "d2", "d3"]
    rr = loadgen.rerank_requests("q", docs, 12, 5, path="/v1/rerank", model="m")
    result = asyncio.run(loadgen.run_load(fake_server, rr, name="d", concurrency=1))
    assert (result.ok, result.errors, result.items, result.tokens) == (5, 0, 15, 60)

    bad_path = loadgen.rerank_requests("q", docs, 12, 2, path="/nope", model="m")
    result = asyncio.run(loadgen.run_load(fake_server, bad_path, name="d", concurrency=1))
    assert (result.ok, result.errors) == (0, 2)


def test_load_generator_time_bound(fake_server: str) -> None:
    reqs = loadgen.embed_requests(["x"] * 5000, [3] * 5000, 1, path="/v1/embeddings", model="m")
    t0 = time.perf_counter()
    result = asyncio.run(
        loadgen.run_load(fake_server, reqs, name="b", concurrency=4, time_limit_s=0.3)
    )
    assert time.perf_counter() - t0 < 3
    assert result.timed_out and 0 < result.ok < 5000 and result.errors == 0


def test_fetch_embeddings(fake_server: str) -> None:
    vecs = asyncio.run(
        loadgen.fetch_embeddings(fake_server, ["a", "bbb"], path="/v1/embeddings", model="m")
    )
    assert vecs == [[1.0, 1.0, 0.0, 0.5], [1.0, 3.0, 0.0, 0.5]]


def test_merge_results_sums_slices(fake_server: str) -> None:
    texts = corpus.make_sentences(64)
    tokens = [5] * 64
    flops = [2.0] * 64
    halves = [
        loadgen.embed_requests(
            texts[i : i + 32], tokens[i : i + 32], 8, path="/v1/embeddings", model="m",
            flops=flops[i : i + 32],
        )
        for i in (0, 32)
    ]  # fmt: skip
    parts = [asyncio.run(loadgen.run_load(fake_server, h, name="a", concurrency=2)) for h in halves]
    merged = loadgen.merge_results(parts)
    assert (merged.planned, merged.ok, merged.items, merged.tokens) == (8, 8, 64, 320)
    assert merged.flops == pytest.approx(128.0)
    assert merged.wall_s == pytest.approx(parts[0].wall_s + parts[1].wall_s)
    assert sorted(merged.latencies_ms) == sorted(parts[0].latencies_ms + parts[1].latencies_ms)


def test_runner_slices_and_flops() -> None:
    from benchmarks import run

    for n, parts in ((2048, 4), (64, 4), (7, 3), (5, 8)):
        bounds = [run.slice_bounds(n, parts, k) for k in range(parts)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    shape = flops.ModelShape(params_non_embedding=1000, n_layers=2, d_model=8)
    assert shape.flops(10) == 2 * 1000 * 10 + 4 * 2 * 8 * 10 * 10


_ALLOCATE_ON_ENTER = """
import sys
print("started", flush=True)
sys.stdin.readline()
held = bytearray({mib} << 20)
for i in range(0, len(held), 4096):
    held[i] = 1
print("held", flush=True)
sys.stdin.readline()
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_peak_rss_covers_the_block_not_start_up() -> None:
    """A 200 MiB start-up spike is forgotten; 96 MiB touched inside the block is counted."""
    from benchmarks import run

    code = "x = bytearray(200 << 20)\nfor i in range(0, len(x), 4096): x[i] = 1\ndel x\n"
    child = subprocess.Popen(
        [sys.executable, "-c", code + _ALLOCATE_ON_ENTER.format(mib=96)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin and child.stdout
    try:
        assert child.stdout.readline().strip() == "started"  # the spike is over
        with run.PeakRss([child.pid]) as peak:
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "held"
        mib = peak.peak[child.pid] / 2**20
        assert 96 <= mib < 200, mib
    finally:
        child.kill()
        child.wait()


def test_media_requests_cover_every_slice_and_cycle_the_pool(fake_server: str) -> None:
    """benchmarks/media.py: slices partition a load, inputs cycle through the pool, the body
    is the issue's shape (``modality`` + data URIs), and the load generator counts items."""
    from benchmarks import media, run

    ember = run.ember_server("torch:float32", sys.executable)
    load = media.MediaLoad("i8", "image", 8, 4, 10, "test")
    pool = [f"data:image/jpeg;base64,{i}" for i in range(12)]
    parts = [media.build_requests(ember, load, pool, k, 3) for k in range(3)]
    reqs = [r for part in parts for r in part]
    assert len(reqs) == 10 and all(r.items == 8 and r.path == "/v1/embeddings" for r in reqs)
    sent = [x for r in reqs for x in r.body["input"]]
    assert sent == [pool[i % 12] for i in range(80)]
    assert {r.body["modality"] for r in reqs} == {"image"}
    result = asyncio.run(loadgen.run_load(fake_server, parts[0], name="i8", concurrency=4))
    assert (result.ok, result.errors, result.items) == (len(parts[0]), 0, 8 * len(parts[0]))


def test_media_inputs_and_served_directory(tmp_path: Path) -> None:
    """The served copy drops transformers 5's processor_config.json (Infinity's 4.48 fails
    on it); inputs are distinct 224x224 JPEGs and 5 s 48 kHz clips under the body limit."""
    import base64
    import io

    import soundfile
    from PIL import Image

    from benchmarks import media

    built = tmp_path / "model"
    built.mkdir()
    for name in ("config.json", "processor_config.json", "preprocessor_config.json"):
        (built / name).write_text("{}")
    served = media.served_copy(built)
    assert sorted(p.name for p in served.iterdir()) == ["config.json", "preprocessor_config.json"]
    assert media.served_copy(built) == served  # idempotent

    images = media.image_uris(2)
    assert images[0] != images[1] and images[0].startswith("data:image/jpeg;base64,")
    image = Image.open(io.BytesIO(media.uri_bytes(images[0])))
    assert (image.format, image.size) == ("JPEG", (224, 224))
    clips = media.clip_uris(2)
    assert clips[0] != clips[1]
    samples, rate = soundfile.read(io.BytesIO(base64.b64decode(clips[0].split(",", 1)[1])))
    assert rate == 48000 and len(samples) == 5 * 48000
    # A request of the audio load stays under Ember's default 2,000,000-byte body limit.
    per = media.LOADS["a3"].per_request
    assert per * len(clips[0]) + 200 < 2_000_000


def test_media_report_renders() -> None:
    from benchmarks import media

    def load(rate: float) -> dict:
        return {"items_per_s": rate, "ok": 4, "errors": 0, "slice_rates": [rate - 1, rate + 1],
                "cpu_ms_per_item": 60.0, "cpu_cores": 1.8}  # fmt: skip

    rows = [
        {"server": "ember-torch-float32", "family": "ember", "cosine_image_min": 0.99999,
         "loads": {"i8": load(20.0), "i1": load(18.0), "a3": load(3.0)}},
        {"server": "infinity-torch", "family": "infinity", "error": "RuntimeError: x",
         "loads": {"i8": load(10.0), "i1": load(12.0)}},
    ]  # fmt: skip
    media.add_ratios(rows)
    assert rows[0]["vs_infinity"] == {"i8": 2.0, "i1": 1.5}
    # Slice by slice: the servers' k-th slices ran back to back.
    assert rows[0]["vs_infinity_per_slice"] == {"i8": [2.11, 1.91], "i1": [1.55, 1.46]}
    meta = {
        "date": "2026-12-01", "cpu": "cpu", "cores": 2, "mem_gib": 1, "threads": 2,
        "gemm_peak_gflops": 400.0, "gemm_start_gflops": 400.0, "gemm_end_gflops": 390.0,
        "loadavg_start": "0 0 0", "loadavg_end": "1 1 1", "foreign_cpu":
        {"mean_cores": 0.1, "max_cores": 0.5}, "clip_gflops_per_image": 8.8,
        "ceiling": {"batch": 8, "images_per_s": 30.0}, "versions": "v", "transformers": "5",
        "slices": 2, "time_limit_s": 60.0, "command": "benchmarks/media.py", "total_s": 1.0,
        "loadavg_per_slice": {"clip": ["0 0 0"]},
    }  # fmt: skip
    text = media.markdown({"meta": meta, "rows": rows})
    assert "| ember-torch-float32 |" in text and "20.0 (19.0–21.0; med 20.0)" in text
    assert "infinity-torch (failed: RuntimeError: x)" in text
    assert "60 (1.80) / 60 (1.80) / 60 (1.80)" in text and "2.01 (1.91–2.11)" in text


def test_cache_workload_repeats_a_few_queries_and_is_deterministic() -> None:
    from benchmarks import cache

    queries = cache.workload(1000, 500, 1.1, seed=1)
    assert queries == cache.workload(1000, 500, 1.1, seed=1)
    counts = sorted((queries.count(q) for q in set(queries)), reverse=True)
    assert len(counts) < 500 and counts[0] > 50 * counts[-1]  # a head and a long tail


def test_served_cpu_reads_thread_time_and_splits_it() -> None:
    """The split's parts: this process's busy thread shows its CPU; threads are grouped by
    Python name (native runtime workers, unnamed, count as the forward); the report adds up."""
    import os

    from benchmarks import served_cpu

    pid = os.getpid()
    spent: list[float] = []
    seen: dict[int, float] = {}

    def spin() -> None:  # 0.2 s of this thread's own CPU (however slow the host), then read
        start, give_up = time.thread_time(), time.monotonic() + 30
        while time.thread_time() - start < 0.2 and time.monotonic() < give_up:
            pass
        spent.append(time.thread_time())
        seen.update(served_cpu.thread_cpu_seconds(pid))

    worker = threading.Thread(target=spin)
    worker.start()
    worker.join(60)
    # /proc counts in clock ticks (10 ms): the thread's reading is its own CPU to a tick or two.
    assert spent and spent[0] >= 0.2
    assert worker.native_id is not None and seen[worker.native_id] >= spent[0] - 0.03
    assert seen[threading.main_thread().native_id] >= 0

    # py-spy comes with the bench extra: it names this process's threads as Python does.
    named = served_cpu.python_thread_names(pid)
    assert named is not None and named[threading.main_thread().native_id] == "MainThread"

    names = {11: "MainThread", 12: "fwd-bench_0", 13: "tokenize_1", 14: "uvloop_0"}
    assert served_cpu.group_of(11, 11, names) == "event loop"
    assert served_cpu.group_of(12, 11, names) == "forward"
    assert served_cpu.group_of(15, 11, names) == "forward"  # a native runtime worker
    assert served_cpu.group_of(13, 11, names) == "tokenize"
    assert served_cpu.group_of(14, 11, names) == "other"
    assert served_cpu.group_of(12, 11, None) == "other"  # no py-spy: only the loop is told

    cpu_s = {"event loop": 1.0, "tokenize": 0.5, "forward": 8.0, "other": 0.5}
    row = {"server": "ember-fast", "threads_named": True, "loads": {"a": {
        "sent_per_s": 250.0, "wall_s": 5.0, "errors": 0, "server_cores": 2.0,
        "client_cores": 0.02, "cpu_s": cpu_s,
        "cpu_ms_per_sentence": {k: v for k, v in cpu_s.items()}}}}  # fmt: skip
    meta = {"date": "2026-12-04", "cores": 2, "loads": ["a"], "seconds": 5.0,
            "command": "benchmarks/served_cpu.py",
            "cpu_kind": {"model_name": "cpu", "key_flags": ["avx2"]}}  # fmt: skip
    text = served_cpu.markdown({"meta": meta, "rows": [row]})
    assert "| ember-fast | (a) | 250 | 2.00 | 80% | 10% | 5% | 5% | 0.02 | 8.00 | 2.00 |" in text
