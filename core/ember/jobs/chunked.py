"""A chunked corpus job's rows (``--chunk-tokens``): one Parquet row per chunk of each input,
and the input's own row before them when an aggregate is asked.

The checkpoint still counts input rows: a shard holds every chunk of the inputs it covers,
so a resume starts at an input's first chunk and writes each chunk once. A chunk row is
(``id``, ``chunk``: its 0-based index in the input, ``char_start``, ``char_end``: code
points of the input, so ``text[char_start:char_end]`` is the chunk, ``embedding``, and
``text`` with ``--chunk-text``). A document row has ``chunk`` null (SQL's "not a chunk":
``WHERE chunk IS NULL`` in DuckDB, ``pl.col("chunk").is_null()``), the characters its
chunks cover, the aggregate as ``embedding`` and a null ``text``; one schema, one file per
shard, so a document and its chunks are published together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.chunking import Span
from ember.outputs import ChunkedVectors


@dataclass(frozen=True)
class Chunked:
    """One input's value: its chunks' vectors [k, d], where each lies, their texts (when
    asked) and the document's aggregate vector (None: none asked)."""

    vectors: np.ndarray
    spans: Sequence[Span]
    texts: Sequence[str] | None
    document: np.ndarray | None


def per_input(output: ChunkedVectors) -> list[Chunked]:
    """An engine call's chunked answer, one value per input (as ``Result.outputs`` is)."""
    texts = output.texts or [None] * len(output.chunks)
    documents = output.documents
    return [
        Chunked(vectors, spans, text, None if documents is None else documents[i])
        for i, (vectors, spans, text) in enumerate(
            zip(output.chunks, output.spans, texts, strict=True)
        )
    ]


@dataclass(frozen=True)
class ChunkRows:
    """Lays a shard out as chunk rows: ``width`` the vectors' size (a shard whose rows are
    all refused still has the column's type), ``text`` whether chunk texts are written."""

    width: int
    text: bool = False

    def __call__(self, ids: Sequence[Any], values: Sequence[Chunked], id_type: Any) -> Any:
        """The shard's table (``ids`` and ``values`` one per input, refused ones left out)."""
        import pyarrow as pa

        from ember.jobs.shards import rows_table

        row_ids: list[Any] = []
        chunk: list[int | None] = []
        starts: list[int] = []
        ends: list[int] = []
        texts: list[str | None] = []
        vectors: list[np.ndarray] = []
        for row_id, value in zip(ids, values, strict=True):
            spans = value.spans
            if value.document is not None:
                row_ids.append(row_id)
                chunk.append(None)
                starts.append(spans[0].char_start if spans else 0)
                ends.append(spans[-1].char_end if spans else 0)
                texts.append(None)
                vectors.append(value.document[None, :])
            row_ids.extend([row_id] * len(spans))
            chunk.extend(range(len(spans)))
            starts.extend(s.char_start for s in spans)
            ends.extend(s.char_end for s in spans)
            texts.extend(value.texts or [None] * len(spans))
            vectors.append(value.vectors)
        matrix = np.concatenate(vectors) if vectors else np.zeros((0, self.width))
        flat = pa.array(np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1))
        table = rows_table(row_ids, pa.FixedSizeListArray.from_arrays(flat, self.width), id_type)
        columns = {
            "chunk": pa.array(chunk, type=pa.int32()),
            "char_start": pa.array(starts, type=pa.int64()),
            "char_end": pa.array(ends, type=pa.int64()),
        }
        for at, (name, column) in enumerate(columns.items(), start=1):
            table = table.add_column(at, name, column)
        if self.text:
            table = table.append_column("text", pa.array(texts, type=pa.string()))
        return table
