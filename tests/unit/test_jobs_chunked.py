"""The chunked job's rows, window and flags: a document row before its chunks (chunk
null), texts weighed by their chunks, and the chunk flags refused without --chunk-tokens,
with --ray and with a batch file, each in one line (a model that cannot chunk:
test_jobs_runner.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ember.chunking import Chunking, Span
from ember.cli import build_parser
from ember.errors import BadRequest, ConfigError
from ember.jobs.chunked import Chunked, ChunkRows, per_input
from ember.jobs.command import chunking_of_args, run_embed
from ember.jobs.runner import chunks_weighed
from ember.outputs import ChunkedVectors


def _args(*extra: str) -> object:
    return build_parser().parse_args(["embed", "c.jsonl", "--output", "o", *extra])


def test_a_shard_holds_each_document_row_then_its_chunks() -> None:
    spans = [[Span(0, 3, 0, 11), Span(2, 5, 6, 20)], [Span(0, 1, 0, 2)]]
    chunks = [np.array([[1, 0], [0, 1]], np.float32), np.array([[2, 2]], np.float32)]
    documents = np.array([[5, 5], [6, 6]], np.float32)
    values = per_input(ChunkedVectors(documents, chunks, spans, [["a", "b"], ["c"]]))
    table = ChunkRows(2, text=True)(["x", "y"], values, pa.string())
    assert table.column_names == ["id", "chunk", "char_start", "char_end", "embedding", "text"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 2)
    assert table.drop(["embedding"]).to_pylist() == [
        {"id": "x", "chunk": None, "char_start": 0, "char_end": 20, "text": None},
        {"id": "x", "chunk": 0, "char_start": 0, "char_end": 11, "text": "a"},
        {"id": "x", "chunk": 1, "char_start": 6, "char_end": 20, "text": "b"},
        {"id": "y", "chunk": None, "char_start": 0, "char_end": 2, "text": None},
        {"id": "y", "chunk": 0, "char_start": 0, "char_end": 2, "text": "c"},
    ]
    assert table.column("embedding").to_pylist()[:3] == [[5, 5], [1, 0], [0, 1]]

    # No aggregate and no text: chunk rows only, no text column; no rows: the same schema.
    bare = [Chunked(v.vectors, v.spans, None, None) for v in values]
    table = ChunkRows(2)([7, 8], bare, pa.int64())
    assert table.column("chunk").to_pylist() == [0, 1, 0]
    assert table.column("id").to_pylist() == [7, 7, 8]
    empty = ChunkRows(2)([], [], pa.int64())
    assert empty.num_rows == 0 and empty.schema == table.schema


def test_the_window_weighs_a_text_by_its_chunks() -> None:
    chunking = Chunking(size=32, overlap=8)  # a chunk per 24 tokens: 96 characters
    assert [chunks_weighed(chunking, "x" * n) for n in (0, 96, 97, 960)] == [1, 1, 2, 10]
    assert chunks_weighed(Chunking(), "x" * 1024) == 1  # the model's size: 256 tokens


def test_chunk_flags() -> None:
    assert chunking_of_args(_args()) is None
    assert chunking_of_args(_args("--chunk-tokens", "64")) == Chunking(size=64, aggregate="none")
    full = _args(
        "--chunk-tokens", "64", "--overlap", "8", "--chunk-boundary", "sentence",
        "--late-chunking", "--aggregate", "max", "--chunk-text",
    )  # fmt: skip
    assert chunking_of_args(full) == Chunking(64, 8, "sentence", True, False, "max", True)
    with pytest.raises(ConfigError, match="^--overlap is for chunks: pass --chunk-tokens N too$"):
        chunking_of_args(_args("--overlap", "8"))
    with pytest.raises(ConfigError, match="^--late-chunking is for chunks"):
        chunking_of_args(_args("--late-chunking"))
    with pytest.raises(BadRequest, match=r"overlap \(8\) must be less than its size \(8\)"):
        chunking_of_args(_args("--chunk-tokens", "8", "--overlap", "8"))

    embed = build_parser()._subparsers._group_actions[0].choices["embed"]  # type: ignore[union-attr]
    shown = " ".join(embed.format_help().split())
    for words in (
        "--chunk-tokens N", "--overlap M Tokens each chunk repeats of the one before [0]",
        "--chunk-boundary {token,sentence}", "(sentence) [token]", "--late-chunking",
        "--aggregate {none,mean,max,first}", "embedding (mean: weighted by their tokens) [none]",
        "--chunk-text",
    ):  # fmt: skip
        assert words in shown, words


def test_chunking_is_refused_on_ray_and_in_batch_files(tmp_path: Path) -> None:
    from ember.config import settings_from_env

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "a"}\n')
    batch = tmp_path / "b.jsonl"
    batch.write_text('{"custom_id": "1", "url": "/v1/embeddings", "body": {"input": "a"}}\n')
    settings = settings_from_env(device="cpu")
    ray = build_parser().parse_args(
        ["embed", str(corpus), "--ray", "--output", str(tmp_path / "o"), "--chunk-tokens", "8"]
    )
    with pytest.raises(ConfigError, match="^--chunk-tokens runs in-process: leave out --ray$"):
        run_embed(ray, settings)
    on_batch = build_parser().parse_args(
        ["embed", str(batch), "--output", str(tmp_path / "r.jsonl"), "--chunk-tokens", "8"]
    )
    with pytest.raises(ConfigError, match="^--chunk-tokens is for a corpus; a batch file's"):
        run_embed(on_batch, settings)
    assert not (tmp_path / "o").exists() and not (tmp_path / "r.jsonl").exists()
