"""The static-shape rules of the Neuron backend: buckets, padding, truncation, order."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.neuron_shapes import (
    Chunk,
    bucket_for,
    default_buckets,
    lengths_from_mask,
    normalize_buckets,
    pad_chunk,
    plan_chunks,
    scatter_results,
)
from ember.batch import TokenBatch

PAD = 0


def make_batch(lengths: list[int], width: int | None = None) -> TokenBatch:
    """Right-padded batch whose tokens encode (row, position) so moves are visible."""
    width = width or max(lengths)
    ids = np.full((len(lengths), width), PAD, dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = 1000 * (row + 1) + np.arange(n)
        mask[row, :n] = 1
        types[row, n // 2 : n] = 1
    return TokenBatch(input_ids=ids, attention_mask=mask, token_type_ids=types)


def test_normalize_buckets_sorts_dedups_and_rejects_bad_lists() -> None:
    assert normalize_buckets([512, 128, 256, 128]) == (128, 256, 512)
    with pytest.raises(ValueError):
        normalize_buckets([])
    with pytest.raises(ValueError):
        normalize_buckets([0, 128])


def test_default_buckets_are_capped_at_the_model_maximum() -> None:
    assert default_buckets(512) == (128, 256, 512)
    assert default_buckets(8192) == (128, 256, 512)
    assert default_buckets(256) == (128, 256)
    assert default_buckets(100) == (100,)


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(1, 16), (16, 16), (17, 32), (32, 32), (33, 64), (64, 64), (65, 64), (1000, 64)],
)
def test_bucket_is_the_smallest_that_fits_else_the_largest(length: int, bucket: int) -> None:
    assert bucket_for(length, (16, 32, 64)) == bucket


def test_plan_groups_by_bucket_keeps_order_and_cuts_at_batch_size() -> None:
    lengths = [5, 40, 12, 3, 70, 30, 9, 16, 2]
    chunks = plan_chunks(lengths, (16, 32, 64), batch_size=2)
    assert chunks == [
        Chunk(16, (0, 2)),
        Chunk(16, (3, 6)),
        Chunk(16, (7, 8)),
        Chunk(32, (5,)),
        Chunk(64, (1, 4)),
    ]
    # Every row lands in exactly one chunk, no chunk is over the batch size.
    rows = [r for c in chunks for r in c.rows]
    assert sorted(rows) == list(range(len(lengths)))
    assert all(1 <= c.size <= 2 for c in chunks)


def test_plan_leaves_at_most_one_partial_chunk_per_bucket() -> None:
    chunks = plan_chunks([10] * 11, (16, 32), batch_size=4)
    assert [c.size for c in chunks] == [4, 4, 3]


def test_pad_chunk_gives_exactly_b_by_bucket_with_pad_rows_for_a_partial_chunk() -> None:
    batch = make_batch([5, 12, 3])
    chunk = Chunk(16, (2, 0))  # 2 real rows, B = 4
    out = pad_chunk(batch, chunk, batch_size=4, pad_token_id=PAD)
    assert out.shape == (4, 16)
    for arr in (out.input_ids, out.attention_mask, out.token_type_ids):
        assert arr.dtype == np.int64
    # Real rows: tokens copied in chunk order, padding to the bucket with pad id / mask 0.
    np.testing.assert_array_equal(out.input_ids[0, :3], batch.input_ids[2, :3])
    np.testing.assert_array_equal(out.input_ids[1, :5], batch.input_ids[0, :5])
    assert (out.input_ids[0, 3:] == PAD).all() and (out.attention_mask[0, 3:] == 0).all()
    np.testing.assert_array_equal(lengths_from_mask(out.attention_mask)[:2], [3, 5])
    np.testing.assert_array_equal(out.token_type_ids[1, :5], batch.token_type_ids[0, :5])
    # Pad rows copy the first real row (a valid input whose output is discarded).
    for r in (2, 3):
        np.testing.assert_array_equal(out.input_ids[r], out.input_ids[0])
        np.testing.assert_array_equal(out.attention_mask[r], out.attention_mask[0])


def test_pad_chunk_narrows_a_batch_wider_than_the_bucket() -> None:
    batch = make_batch([4, 40])  # padded to width 40, row 0 still fits bucket 16
    out = pad_chunk(batch, Chunk(16, (0,)), batch_size=1)
    assert out.shape == (1, 16)
    np.testing.assert_array_equal(out.input_ids[0, :4], batch.input_ids[0, :4])


def test_truncation_keeps_the_first_tokens_and_the_last_real_token() -> None:
    batch = make_batch([100, 7])
    out = pad_chunk(batch, Chunk(64, (0, 1)), batch_size=2)
    assert out.shape == (2, 64)
    assert out.attention_mask[0].sum() == 64
    np.testing.assert_array_equal(out.input_ids[0, :63], batch.input_ids[0, :63])
    assert out.input_ids[0, 63] == batch.input_ids[0, 99]  # the [SEP]-like last token
    assert out.token_type_ids[0, 63] == batch.token_type_ids[0, 99]
    # A row that fits is untouched by truncation.
    np.testing.assert_array_equal(out.input_ids[1, :7], batch.input_ids[1, :7])
    plain = pad_chunk(batch, Chunk(64, (0,)), batch_size=1, keep_last_token=False)
    np.testing.assert_array_equal(plain.input_ids[0], batch.input_ids[0, :64])


def test_pad_chunk_rejects_empty_or_oversized_chunks() -> None:
    batch = make_batch([3, 3, 3])
    with pytest.raises(ValueError):
        pad_chunk(batch, Chunk(16, ()), batch_size=2)
    with pytest.raises(ValueError):
        pad_chunk(batch, Chunk(16, (0, 1, 2)), batch_size=2)


def test_scatter_drops_pad_rows_and_restores_original_order() -> None:
    chunks = [Chunk(16, (3, 0)), Chunk(32, (2,)), Chunk(64, (1,))]
    # Each chunk returns B = 2 rows: its real rows' ids, then a pad row of -1.
    parts = [(c, np.array([[r] for r in c.rows] + [[-1]] * (2 - c.size), float)) for c in chunks]
    out = scatter_results(4, parts)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out[:, 0], [0, 1, 2, 3])


def test_scatter_refuses_missing_rows_and_short_results() -> None:
    with pytest.raises(ValueError, match="not in any chunk"):
        scatter_results(3, [(Chunk(16, (0, 1)), np.zeros((2, 4)))])
    with pytest.raises(ValueError, match="came back with"):
        scatter_results(2, [(Chunk(16, (0, 1)), np.zeros((1, 4)))])


def test_round_trip_plan_pad_scatter_is_identity_on_row_ids() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 90, size=23).tolist()
    batch = make_batch(lengths)
    chunks = plan_chunks(lengths, (16, 32, 64), batch_size=4)
    parts = []
    for chunk in chunks:
        padded = pad_chunk(batch, chunk, 4)
        assert padded.shape == (4, chunk.bucket)
        parts.append((chunk, padded.input_ids[:, :1] // 1000 - 1))  # recover the row id
    np.testing.assert_array_equal(scatter_results(len(lengths), parts)[:, 0], range(23))
