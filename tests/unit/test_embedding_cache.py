"""The embedding cache alone (ember.engine.cache): LRU bounds by entries and bytes, what a
key holds, memory under 100k distinct inputs, metrics; the model identity its keys carry."""

from __future__ import annotations

import asyncio
import gc
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest

from ember.backends.base import BackendInfo
from ember.engine.cache import (
    ENTRY_OVERHEAD,
    EmbeddingCache,
    embed_through,
    input_key,
    model_identity,
)
from ember.engine.result import Result, Timings
from ember.families.registry import for_task
from ember.heads.sparse import SparseVector
from ember.metrics import Metrics
from ember.models.spec import ModelSpec, ResolvedModel
from ember.outputs import DenseVectors

DIM = 8
OPTIONS = {
    "output": "dense",
    "normalize": None,
    "dimensions": None,
    "truncate": True,
    "truncation_direction": "right",
    "prompt_name": None,
    "query": None,
    "modality": "text",
}


def metric(metrics: Metrics, line_start: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def row(i: int) -> np.ndarray:
    return np.full(DIM, i, dtype=np.float32)


class Recording:
    """A stand-in for ``Engine._embed``: each input's vector derived from its text, so a
    wrong merge shows; records what it was asked for."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def __call__(self, items: list) -> Result:
        self.calls.append(list(items))
        outputs = np.stack([row(len(t)) + np.float32(ord(t[0])) for t in items])
        tokens = [len(t) for t in items]
        return Result(
            DenseVectors(outputs), sum(tokens), Timings(0.1, 0.2, 0.3), input_tokens=tokens
        )


def run(
    cache: EmbeddingCache, items: list, compute: Recording, model: str = "m", **changes: object
) -> Result:
    """``items`` through the cache for ``model`` (its identity derived from the name)."""
    options = {**OPTIONS, **changes}
    return asyncio.run(embed_through(cache, model, f"{model}:id", items, options, compute))


def test_hits_skip_the_run_and_merge_in_order_with_the_same_tokens() -> None:
    cache, compute = EmbeddingCache(100, 1 << 20), Recording()
    first = run(cache, ["apple", "kiwi"], compute)
    mixed = run(cache, ["fig", "kiwi", "apple"], compute)
    assert compute.calls == [["apple", "kiwi"], ["fig"]]  # only the miss is computed
    assert np.array_equal(mixed.outputs[1:], first.outputs[::-1])
    assert mixed.outputs.dtype == np.float32 and mixed.outputs.flags["C_CONTIGUOUS"]
    assert mixed.input_tokens == [3, 4, 5] and mixed.prompt_tokens == 12
    again = run(cache, ["fig", "kiwi", "apple"], compute)
    assert len(compute.calls) == 2  # all hits: no run at all
    assert again.outputs.tobytes() == mixed.outputs.tobytes()
    assert again.prompt_tokens == mixed.prompt_tokens and again.timings == Timings()


@pytest.mark.parametrize(
    "change",
    [
        {"model": "other"},
        {"prompt_name": "query"},
        {"dimensions": 4},
        {"query": True},
        {"query": False},
        {"normalize": False},
        {"truncate": False},
        {"truncation_direction": "left"},
        {"output": "multi"},
    ],
)
def test_no_hit_when_an_output_changing_option_differs(change: dict) -> None:
    cache, compute = EmbeddingCache(100, 1 << 20), Recording()
    run(cache, ["same text"], compute)
    run(cache, ["same text"], compute, **change)
    assert len(compute.calls) == 2
    run(cache, ["same text"], compute, **change)  # and that one is cached under its own key
    assert len(compute.calls) == 2


def test_input_keys_text_ids_and_media() -> None:
    assert input_key("a text", "text") == "a text"  # the text itself: compared in full
    assert input_key([101, 7592, 102], "text") == np.array([101, 7592, 102]).tobytes()
    uri = "data:image/png;base64,iVBORw0KGgo="
    assert input_key(uri, "image") == input_key(uri.encode(), "image")  # digest of the bytes
    assert input_key(uri, "image") != input_key(uri + "A", "image")
    assert input_key("https://example.com/cat.png", "image") is None  # may change: not cached


def test_lru_order_entry_bound_and_metrics() -> None:
    metrics = Metrics()
    cache = EmbeddingCache(3, 1 << 20, metrics)
    for i in range(3):
        cache.store(("k", i), row(i), tokens=i)
    assert [e is not None for e in cache.lookup("m", [("k", 0)])] == [True]  # 0 now newest
    cache.store(("k", 3), row(3), tokens=3)  # evicts 1, the least recently used
    found = cache.lookup("m", [("k", i) for i in range(4)])
    assert [e is not None for e in found] == [True, False, True, True]
    assert found[0].row.flags.writeable is False  # nobody can change a cached row
    assert metric(metrics, 'ember_cache_hits_total{model="m"}') == 4
    assert metric(metrics, 'ember_cache_misses_total{model="m"}') == 1
    assert metric(metrics, "ember_cache_evictions_total") == 1
    assert metric(metrics, "ember_cache_entries") == 3
    assert metric(metrics, "ember_cache_bytes") == cache.bytes > 3 * (DIM * 4 + ENTRY_OVERHEAD)


def test_byte_bound_and_sparse_and_multi_rows() -> None:
    per = DIM * 4 + ENTRY_OVERHEAD
    cache = EmbeddingCache(1000, 2 * per + 200)
    for i in range(5):
        cache.store(i, row(i), tokens=1)
    assert len(cache) == 2 and cache.bytes <= cache.max_bytes
    assert cache.store("huge", np.zeros(10_000, np.float32), tokens=1) is None  # over the bound
    sparse = SparseVector(np.array([3, 9], np.int64), np.array([0.5, 1.5], np.float32))
    kept = cache.store("sparse", sparse, tokens=2)
    assert kept is not None and np.array_equal(kept.row.indices, sparse.indices)
    multi = cache.store("multi", np.ones((4, 3), np.float32), tokens=4)
    assert multi is not None and multi.row.shape == (4, 3)
    assert cache.bytes <= cache.max_bytes


def test_memory_stays_bounded_under_100k_distinct_inputs() -> None:
    """100k distinct 384-wide inputs (150 MB of vectors) through a 2 MB cache: it never
    holds more than its bound, and the process's own allocations (traced while the cache
    fills and turns over three times, where a leak in eviction would show) stay within the
    bytes it counts."""
    dim, bound, inputs = 384, 2 * 1024 * 1024, 100_000
    cache = EmbeddingCache(1_000_000, bound)
    vector = np.arange(dim, dtype=np.float32)  # stored as a copy each time
    capacity = bound // (dim * 4 + ENTRY_OVERHEAD)
    traced = 4 * capacity
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(traced):
            cache.store(("model", f"input number {i}"), vector, tokens=7)
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert held <= bound  # the counted bytes cover what the entries really take
    for i in range(traced, inputs):
        cache.store(("model", f"input number {i}"), vector, tokens=7)
        if i % 10_000 == 0:
            assert cache.bytes <= bound
    assert cache.bytes <= bound and len(cache) >= capacity * 0.9
    newest, oldest = ("model", f"input number {inputs - 1}"), ("model", "input number 0")
    assert [e is not None for e in cache.lookup("model", [newest, oldest])] == [True, False]


def _model(directory: Path, name: str = "m") -> ResolvedModel:
    return ResolvedModel(
        spec=ModelSpec(model_id=str(directory)),
        path=directory,
        served_name=name,
        task="embed",
        architecture="BertModel",
        model_type="bert",
        hidden_size=DIM,
        max_length=16,
        pooling="mean",
        normalize=True,
        family=for_task("embed"),
    )


def test_model_identity_names_the_model_its_files_and_backend(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * 64)
    cpu = BackendInfo("onnx", "cpu", "float32")
    identity = model_identity(_model(tmp_path), cpu)
    assert model_identity(_model(tmp_path), cpu) == identity  # stable
    assert model_identity(_model(tmp_path, "other"), cpu) != identity
    assert model_identity(_model(tmp_path), BackendInfo("onnx", "cpu", "int8")) != identity
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # a new revision
    assert model_identity(_model(tmp_path), cpu) != identity
    changed = model_identity(_model(tmp_path), cpu)
    (tmp_path / "config.json").write_text('{"hidden_size": 9}')
    assert model_identity(_model(tmp_path), cpu) != changed
