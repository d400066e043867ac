"""The job's pipeline: input order whatever order batches finish in, a bounded window,
nothing left running after a failure; and the job's vectors equal the engine's own."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from ember.engine import EmbedRequest
from ember.errors import ConfigError
from ember.jobs.inputs import InputSpec
from ember.jobs.runner import JobOptions, embed_corpus, embed_rows


@dataclass
class _Result:
    outputs: Any


class FakeEngine:
    """Answers each call after a random delay (later calls often first), counting what is
    queued at once; the vector of a text is its row number."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.queued = 0
        self.most_queued = 0
        self.fail_at = fail_at
        self.running: set[asyncio.Task[Any]] = set()
        self.cancelled = 0
        self.rng = random.Random(0)

    async def embed(self, request: EmbedRequest) -> _Result:
        texts = request.inputs
        self.queued += len(texts)
        self.most_queued = max(self.most_queued, self.queued)
        numbers = [int(t.split()[1]) for t in texts]
        delay = self.rng.random() * 0.004
        if self.fail_at is not None and min(numbers) > self.fail_at:
            # Calls after the failing one are still running when it fails, however the
            # host schedules the short sleeps: the job must cancel them, not wait them out.
            delay = 5.0
        try:
            await asyncio.sleep(delay)
            if self.fail_at is not None and self.fail_at in numbers:
                raise RuntimeError("forward failed")
            return _Result(np.array([[n, n] for n in numbers], dtype=np.float32))
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.queued -= len(texts)


def _rows(n: int) -> list[tuple[Any, str]]:
    return [(f"id{i}", f"row {i}") for i in range(n)]


async def _collect(engine: FakeEngine, n: int, **kwargs: Any) -> list[tuple[list, list]]:
    return [
        shard
        async for shard in embed_rows(engine, _rows(n), output="dense", **kwargs)  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(("n", "shard_rows", "chunk"), [(1000, 128, 7), (64, 1000, 64), (5, 2, 1)])
async def test_rows_come_out_in_input_order_in_full_shards(
    n: int, shard_rows: int, chunk: int
) -> None:
    engine = FakeEngine()
    shards = await _collect(engine, n, shard_rows=shard_rows, in_flight=96, chunk_rows=chunk)
    assert [len(ids) for ids, _ in shards[:-1]] == [shard_rows] * (len(shards) - 1)
    ids = [i for shard_ids, _ in shards for i in shard_ids]
    values = [int(v[0]) for _, shard_values in shards for v in shard_values]
    assert ids == [f"id{i}" for i in range(n)]
    assert values == list(range(n))


async def test_the_window_is_kept_full_and_never_passed() -> None:
    engine = FakeEngine()
    await _collect(engine, 2000, shard_rows=500, in_flight=256, chunk_rows=32)
    assert engine.most_queued == 256  # full, and bounded: memory stays flat on any corpus


async def test_a_failure_cancels_what_is_queued_and_propagates() -> None:
    engine = FakeEngine(fail_at=700)
    with pytest.raises(RuntimeError, match="forward failed"):
        await _collect(engine, 5000, shard_rows=100, in_flight=512, chunk_rows=16)
    assert engine.queued == 0 and engine.cancelled > 0  # nothing left running


# ---- the real engine ---------------------------------------------------------------------


def _settings(model: Path) -> Any:
    from ember.config import settings_from_env

    return settings_from_env(model_id=str(model), device="cpu", backend="torch")


def test_dense_job_equals_the_engine(tmp_path: Path, minilm_path: Path) -> None:
    from ember.engine import SyncEngineArray

    texts = [f"sentence {i} " + "about retrieval " * (i % 9) for i in range(150)]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(texts) + "\n")
    options = JobOptions(output=tmp_path / "out", shard_rows=40, in_flight=64, progress=False)
    summary = embed_corpus(_settings(minilm_path), InputSpec.of(corpus), options)
    assert (summary.rows, summary.shards, summary.resumed_from) == (150, 4, 0)
    table = pq.read_table(tmp_path / "out")
    assert table.column("id").to_pylist() == list(range(150))
    got = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    with SyncEngineArray(model_id=str(minilm_path), device="cpu", backend="torch") as ref:
        want = ref.embed(texts)
    assert np.abs(got - want).max() < 1e-5

    again = embed_corpus(_settings(minilm_path), InputSpec.of(corpus), options)
    assert (again.rows, again.rows_this_run) == (150, 0)  # complete: nothing redone

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ConfigError, match="no rows to embed"):
        embed_corpus(
            _settings(minilm_path), InputSpec.of(empty), replace(options, output=tmp_path / "e")
        )
    assert not (tmp_path / "e").exists()  # no checkpoint of a dataset that reads as nothing


@pytest.fixture(scope="module")
def retrieval_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.fixtures.retrieval_models import build_tiny_colbert, build_tiny_splade

    root = tmp_path_factory.mktemp("job-models")
    return {
        "multi": build_tiny_colbert(root / "colbert"),
        "sparse": build_tiny_splade(root / "splade"),
    }


@pytest.mark.parametrize("output", ["sparse", "multi"])
def test_sparse_and_multi_vector_jobs_equal_the_engine(
    tmp_path: Path, retrieval_models: dict[str, Path], output: str
) -> None:
    from ember.engine import SyncEngineArray

    model = retrieval_models[output]
    texts = [f"document {i} " + "token " * (i % 5) for i in range(30)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(f'{{"text": "{t}", "key": {100 + i}}}\n' for i, t in enumerate(texts))
    )
    source = InputSpec.of(corpus, id_column="key")
    options = JobOptions(output=tmp_path / "out", shard_rows=8, progress=False)
    embed_corpus(_settings(model), source, options)
    table = pq.read_table(tmp_path / "out")
    assert table.column("id").to_pylist() == [100 + i for i in range(30)]
    rows = table.column("embedding").to_pylist()
    with SyncEngineArray(model_id=str(model), device="cpu", backend="torch") as ref:
        want = ref.embed(texts, output=output)
    for got, expected in zip(rows, want, strict=True):
        if output == "sparse":
            assert got["indices"] == expected.indices.tolist()
            assert np.allclose(got["values"], expected.values, atol=1e-5)
        else:
            assert np.allclose(np.asarray(got), expected, atol=1e-5)


@pytest.mark.parametrize("output", ["sparse", "multi"])
def test_a_model_that_cannot_chunk_is_refused_at_the_start(
    tmp_path: Path, retrieval_models: dict[str, Path], output: str
) -> None:
    """``ember embed --chunk-tokens`` on SPLADE or ColBERT: one line, before any row."""
    from ember.chunking import Chunking
    from ember.errors import BadRequest

    corpus = tmp_path / "c.txt"
    corpus.write_text("a text\n")
    options = JobOptions(tmp_path / "out", progress=False, chunking=Chunking(size=8))
    with pytest.raises(BadRequest) as refused:
        embed_corpus(_settings(retrieval_models[output]), InputSpec.of(corpus), options)
    message = refused.value.message
    assert "\n" not in message and f"returns {output} embeddings" in message, message
    assert "chunking gives one dense vector per chunk" in message
    assert not (tmp_path / "out" / "_ember_job.json").exists()
