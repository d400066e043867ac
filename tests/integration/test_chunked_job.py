"""`ember embed --chunk-tokens`: a row per chunk whose characters are the chunk and whose
vector is the engine's own for the same ``Chunking`` (plain and late), document rows beside
them; killed with SIGKILL between a shard's publication and its checkpoint, then resumed,
every chunk is in the dataset once, in order."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from ember.chunking import Chunking
from ember.engine import EmbedRequest
from ember.errors import ConfigError
from ember.jobs.inputs import InputSpec
from ember.jobs.runner import JobOptions, job_settings, run_embed_job
from tests.support import REPO, child_env

WORDS = "retrieval models embed every sentence. of a corpus into vectors for search! ünï 😀".split()
# The job as a user runs it, SIGKILLed by itself right after the Nth shard file is published
# and before the checkpoint names it (the instant a resume must clean up after): a kill at
# a known point, not at whatever point a timer reaches.
KILLED_AT_SHARD = """
import os, signal, sys
from ember.jobs import store
from ember.cli import main
write_table, published = store.Store.write_table, []
def write_then_die(self, name, table):
    write_table(self, name, table)
    published.append(name)
    if len(published) == int(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)
store.Store.write_table = write_then_die
sys.exit(main(sys.argv[2:]))
"""


def _texts(n: int, seed: int, longest: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, longest)))) for _ in range(n)]


def _corpus(path: Path, texts: list[str]) -> Path:
    rows = [{"doc": f"d{i:03d}", "text": t} for i, t in enumerate(texts)]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def engine(minilm_path: Path) -> Iterator[tuple[Any, Any]]:
    from ember.config import settings_from_env
    from ember.engine import EngineArray
    from ember.engine.loop import EngineLoop

    settings = settings_from_env(model_id=str(minilm_path), device="cpu", backend="torch")
    loop = EngineLoop()
    engines = EngineArray(job_settings(settings, JobOptions(output=Path())).model_specs())
    loop.run(engines.start())
    try:
        yield loop, engines.get(None)
    finally:
        loop.run(engines.stop())
        loop.close()


def _check_rows(table: Any, texts: list[str], want: Any, chunking: Chunking) -> None:
    """``table`` (the dataset) holds, per text in order, its document row (with an
    aggregate) and then its chunks: the engine's spans, their characters and vectors."""
    rows = table.to_pylist()
    at = 0
    for i, text in enumerate(texts):
        spans, vectors = want.spans[i], want.chunks[i]
        if chunking.aggregate != "none":
            doc = rows[at]
            at += 1
            assert (doc["id"], doc["chunk"], doc.get("text")) == (f"d{i:03d}", None, None)
            assert (doc["char_start"], doc["char_end"]) == (spans[0].char_start, spans[-1].char_end)
            _same(doc["embedding"], want.documents[i])
        for k, (span, vector) in enumerate(zip(spans, vectors, strict=True)):
            row = rows[at]
            at += 1
            assert (row["id"], row["chunk"]) == (f"d{i:03d}", k)
            assert (row["char_start"], row["char_end"]) == (span.char_start, span.char_end)
            if chunking.text:
                assert row["text"] == text[span.char_start : span.char_end]
            _same(row["embedding"], vector)
    assert at == len(rows)


def _same(got: Any, want: np.ndarray) -> None:
    got = np.asarray(got, dtype=np.float64)
    if not want.any():  # late chunking's empty text: a chunk of no tokens
        assert not got.any()
        return
    cosine = got @ want / (np.linalg.norm(got) * np.linalg.norm(want))
    assert cosine >= 0.9999, cosine


@pytest.mark.parametrize(
    "chunking",
    [
        Chunking(size=24, overlap=4, aggregate="mean", text=True),
        # late: texts past the model's 256 tokens are read in overlapping windows
        Chunking(size=40, boundary="sentence", late=True, aggregate="none", text=True),
    ],
    ids=["plain", "late"],
)
def test_chunk_rows_equal_the_engine(
    tmp_path: Path, engine: tuple[Any, Any], chunking: Chunking
) -> None:
    loop, model = engine
    texts = [*_texts(10, 3, 300), "", "one"]
    source = InputSpec.of(_corpus(tmp_path / "c.jsonl", texts), id_column="doc")
    # A window of 8 chunks: the job's queue takes a call's texts, each of many chunks.
    options = JobOptions(
        tmp_path / "out", shard_rows=5, in_flight=8, chunk_rows=4, progress=False,
        chunking=chunking,
    )  # fmt: skip
    summary = loop.run(run_embed_job(model, source, options))
    assert (summary.rows, summary.shards) == (12, 3)
    want = loop.run(model.embed(EmbedRequest(texts, chunking=chunking))).output
    assert max(len(s) for s in want.spans) > 3  # long texts: many chunks
    _check_rows(pq.read_table(tmp_path / "out"), texts, want, chunking)


def test_a_chunked_job_killed_and_resumed_writes_every_chunk_once(
    tmp_path: Path, engine: tuple[Any, Any], minilm_path: Path
) -> None:
    loop, model = engine
    texts = _texts(24, 7, 120)
    corpus = _corpus(tmp_path / "c.jsonl", texts)
    out = tmp_path / "out"
    args = [
        "embed", str(corpus), "--output", str(out), "--id-column", "doc", "--shard-rows", "4",
        "--chunk-tokens", "16", "--overlap", "4", "--aggregate", "mean", "--chunk-text",
        "--model-id", str(minilm_path), "--backend", "torch", "--device", "cpu",
        "--no-progress",
    ]  # fmt: skip
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT_SHARD, "3", *args],
        cwd=REPO,
        env=child_env(drop_prefixes=("EMBER_",)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    checkpoint = json.loads((out / "_ember_job.json").read_text())
    assert [s["name"] for s in checkpoint["shards"]] == ["part-00000.parquet", "part-00001.parquet"]
    assert (out / "part-00002.parquet").exists()  # published, never checkpointed

    # The resume: the same job (the checkpoint's identity must match the command's).
    chunking = Chunking(size=16, overlap=4, aggregate="mean", text=True)
    source = InputSpec.of(corpus, id_column="doc")
    options = JobOptions(out, shard_rows=4, progress=False, chunking=chunking)
    summary = loop.run(run_embed_job(model, source, options))
    assert (summary.resumed_from, summary.rows, summary.shards) == (8, 24, 6)

    table = pq.read_table(out)
    keys = list(zip(*table.select(["id", "chunk"]).to_pydict().values(), strict=True))
    assert len(keys) == len(set(keys))  # every chunk (and document row) once
    want = loop.run(model.embed(EmbedRequest(texts, chunking=chunking))).output
    _check_rows(table, texts, want, chunking)  # in input order, from both runs

    other = replace(options, chunking=replace(chunking, overlap=2))
    with pytest.raises(ConfigError, match=r"another job's output \(differs in chunking\)"):
        loop.run(run_embed_job(model, source, other))


def test_a_model_that_cannot_chunk_is_refused_at_start(
    tmp_path: Path, engine: tuple[Any, Any]
) -> None:
    from ember.errors import BadRequest

    loop, model = engine
    source = InputSpec.of(_corpus(tmp_path / "c.jsonl", ["a text"]), id_column="doc")
    options = JobOptions(tmp_path / "out", progress=False, chunking=Chunking(size=300))
    with pytest.raises(BadRequest, match="chunking size 300 is more than the 254 tokens"):
        loop.run(run_embed_job(model, source, options))
    assert not (tmp_path / "out" / "_ember_job.json").exists()
    # MiniLM pools by mean: late chunking takes any size, past the model's length too.
    late = replace(options, chunking=Chunking(size=300, late=True, aggregate="first"))
    assert loop.run(run_embed_job(model, source, late)).rows == 1
