"""The batch planner's invariants."""

from __future__ import annotations

import asyncio
import random

import numpy as np

from ember.engine.batcher import WorkItem, pad_batch, plan_batches
from ember.engine.tokenizer import Tokens


def _items(lengths: list[int]) -> list[WorkItem]:
    loop = asyncio.new_event_loop()
    try:
        return [
            WorkItem(Tokens(list(range(1, n + 1)), [0] * n), loop.create_future()) for n in lengths
        ]
    finally:
        loop.close()


def test_batches_respect_padded_cost_and_count() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(3, 256) for _ in range(500)]
    batches = plan_batches(_items(lengths), max_tokens=2048, max_size=32)
    assert sum(len(b) for b in batches) == 500
    for batch in batches:
        longest = max(len(it.tokens) for it in batch)
        assert len(batch) <= 32
        assert len(batch) == 1 or longest * len(batch) <= 2048
    flat = [len(it.tokens) for b in batches for it in b]
    assert flat == sorted(flat)  # taken in length order


def test_oversized_single_item_still_gets_a_batch() -> None:
    batches = plan_batches(_items([5000, 3]), max_tokens=1024, max_size=8)
    assert [len(b) for b in batches] == [1, 1]


def test_pad_batch_right_pads_with_mask() -> None:
    batch = pad_batch([Tokens([5, 6, 7], [0, 0, 0]), Tokens([8], [1])], pad_id=0)
    np.testing.assert_array_equal(batch.input_ids, [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(batch.attention_mask, [[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(batch.token_type_ids, [[0, 0, 0], [1, 0, 0]])
    assert batch.real_tokens == 4


def test_cpu_forward_plan() -> None:
    from ember.config import cpu_forward_plan

    assert cpu_forward_plan(0, cores=2) == (2, 1)
    assert cpu_forward_plan(0, cores=4) == (4, 1)
    assert cpu_forward_plan(0, cores=16) == (4, 4)
    assert cpu_forward_plan(1, cores=2) == (1, 2)
    assert cpu_forward_plan(8, cores=2) == (2, 1)
