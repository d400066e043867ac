"""Static-shape planning for compiled Neuron graphs: pick buckets, pad, scatter back.

A graph compiled by neuronx-cc accepts exactly one input shape, ``(B, L)``. Ember
compiles one graph per sequence bucket ``L`` (e.g. 128, 256, 512) at a fixed batch
``B``, so every forward has to be reshaped to fit:

1. each text goes to the smallest bucket that holds all of its tokens (short texts
   do not pay for 512 positions); a text longer than the largest bucket is truncated
   to it;
2. the texts of one bucket are cut into chunks of at most ``B`` rows;
3. each chunk is padded to exactly ``(B, L)``: columns with the pad id and mask 0,
   missing rows with copies of a real row (the graph never sees a malformed input,
   and the copies' outputs are thrown away);
4. the chunks' outputs are written back in the caller's original row order.

Everything here is plain numpy with no Neuron SDK, so the rules are unit-tested on
any machine; ``neuron_backend`` only adds the compiled modules and the dispatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ember.backend_settings import normalize_buckets
from ember.batch import TokenBatch
from ember.defaults import NEURON_BUCKETS

DEFAULT_BUCKETS: tuple[int, ...] = NEURON_BUCKETS  # --neuron-sequence-lengths' default


def default_buckets(max_length: int) -> tuple[int, ...]:
    """128/256/512 capped at the model's own maximum (a 256-token model gets 128, 256)."""
    return normalize_buckets(min(b, max_length) for b in DEFAULT_BUCKETS)


def bucket_for(length: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``length`` tokens; the largest when none does.

    Returning the largest bucket for an over-long text is what makes truncation the
    fallback instead of an error: the engine already truncates to ``max_length``,
    so this only matters if a caller skipped that.
    """
    for bucket in buckets:
        if length <= bucket:
            return bucket
    return buckets[-1]


def lengths_from_mask(attention_mask: np.ndarray) -> np.ndarray:
    """Real-token count per row of a right-padded batch."""
    return attention_mask.astype(np.int64).sum(axis=1)


@dataclass(frozen=True)
class Chunk:
    """Up to ``B`` rows of the caller's batch that run together in one bucket's graph."""

    bucket: int
    rows: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.rows)


def plan_chunks(lengths: Sequence[int], buckets: Sequence[int], batch_size: int) -> list[Chunk]:
    """Group rows by bucket (ascending), in original order, cut into ``batch_size`` chunks.

    Chunks of one bucket are filled before a new one starts, so at most one chunk per
    bucket is partial and the number of padded rows is the minimum possible.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    by_bucket: dict[int, list[int]] = {b: [] for b in buckets}
    for row, length in enumerate(lengths):
        by_bucket[bucket_for(int(length), buckets)].append(row)
    chunks: list[Chunk] = []
    for bucket in buckets:
        rows = by_bucket[bucket]
        for start in range(0, len(rows), batch_size):
            chunks.append(Chunk(bucket=bucket, rows=tuple(rows[start : start + batch_size])))
    return chunks


def pad_chunk(
    batch: TokenBatch,
    chunk: Chunk,
    batch_size: int,
    pad_token_id: int = 0,
    *,
    keep_last_token: bool = True,
) -> TokenBatch:
    """The chunk's rows as a TokenBatch of exactly ``(batch_size, chunk.bucket)``.

    A row longer than the bucket keeps its first ``L - 1`` tokens plus its last real
    token when ``keep_last_token`` is set: for BERT-style inputs that last token is
    ``[SEP]``/``</s>``, so the result equals what the tokenizer's own truncation to
    ``L`` would have produced for a single text.
    """
    n = chunk.size
    length = chunk.bucket
    if n == 0 or n > batch_size:
        raise ValueError(f"a chunk holds 1..{batch_size} rows, got {n}")
    rows = np.asarray(chunk.rows, dtype=np.int64)
    src_ids = batch.input_ids[rows]
    src_mask = batch.attention_mask[rows]
    src_types = batch.token_type_ids[rows]
    real = lengths_from_mask(src_mask)

    ids = np.full((batch_size, length), pad_token_id, dtype=np.int64)
    mask = np.zeros((batch_size, length), dtype=np.int64)
    types = np.zeros((batch_size, length), dtype=np.int64)
    take = min(length, src_ids.shape[1])
    ids[:n, :take] = src_ids[:, :take]
    mask[:n, :take] = src_mask[:, :take]
    types[:n, :take] = src_types[:, :take]

    if keep_last_token:
        cut = np.nonzero(real > length)[0]
        if cut.size:
            last = real[cut] - 1
            ids[cut, length - 1] = src_ids[cut, last]
            types[cut, length - 1] = src_types[cut, last]

    if n < batch_size:
        # Copies of a real row rather than all-padding rows: an all-zero mask is a
        # degenerate input some attention kernels turn into NaN.
        ids[n:] = ids[0]
        mask[n:] = mask[0]
        types[n:] = types[0]
    return TokenBatch(input_ids=ids, attention_mask=mask, token_type_ids=types)


def scatter_results(num_rows: int, parts: Sequence[tuple[Chunk, np.ndarray]]) -> np.ndarray:
    """Drop each chunk's pad rows and place its outputs at the original row indices."""
    if num_rows == 0:
        raise ValueError("nothing to scatter: the batch is empty")
    first = parts[0][1]
    out = np.empty((num_rows, *first.shape[1:]), dtype=np.float32)
    filled = np.zeros(num_rows, dtype=bool)
    for chunk, result in parts:
        if result.shape[0] < chunk.size:
            raise ValueError(f"a chunk of {chunk.size} rows came back with {result.shape[0]}")
        rows = np.asarray(chunk.rows, dtype=np.int64)
        out[rows] = result[: chunk.size]
        filled[rows] = True
    if not filled.all():
        missing = np.nonzero(~filled)[0].tolist()
        raise ValueError(f"rows {missing} were not in any chunk")
    return out
