"""The numpy backend's forward on a hand-made table: EmbeddingBag's mean per row (padding
and rows without tokens included), and SparseStaticEmbedding's weight per id present."""

from __future__ import annotations

import numpy as np

from ember.backends.static_backend import StaticBackend
from ember.batch import EMBEDDINGS, TokenBatch


def _backend(table: np.ndarray, mean: bool) -> StaticBackend:
    backend = StaticBackend.__new__(StaticBackend)  # the table without files
    backend.table, backend.mean = table, mean
    return backend


def _batch(rows: list[list[int]]) -> TokenBatch:
    longest = max(map(len, rows))
    ids = np.full((len(rows), longest), 7, dtype=np.int64)  # padding with a real id
    mask = np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    return TokenBatch(ids, mask, np.zeros_like(ids))


def test_mean_of_each_rows_tokens() -> None:
    table = np.arange(40, dtype=np.float32).reshape(10, 4) ** 1.5
    rows = [[1, 2, 2], [], [9], [3, 0, 5, 5, 8]]
    got = _backend(table, mean=True).forward(_batch(rows))[EMBEDDINGS]
    want = [table[r].mean(axis=0) if r else np.zeros(4) for r in rows]
    np.testing.assert_allclose(got, np.stack(want), rtol=1e-6)


def test_weights_of_the_ids_present_once() -> None:
    weights = np.linspace(0.5, 5, 10, dtype=np.float32)
    rows = [[1, 2, 2], [], [4, 4, 4, 9]]
    got = _backend(weights, mean=False).forward(_batch(rows))[EMBEDDINGS]
    want = np.zeros((3, 10), dtype=np.float32)
    for i, row in enumerate(rows):
        want[i, row] = weights[row]
    np.testing.assert_array_equal(got, want)
