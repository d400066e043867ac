"""The batch planner's invariants."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import numpy as np
import pytest

from ember.backends.base import PaddingBudget
from ember.batch import Tokens
from ember.engine.batcher import PADDING_ACCELERATOR, PADDING_CPU, WorkItem, take_batch
from ember.processors.text import collate


def _items(lengths: list[int]) -> list[WorkItem]:
    loop = asyncio.new_event_loop()
    try:
        return [
            WorkItem(Tokens(list(range(1, n + 1)), [0] * n), loop.create_future()) for n in lengths
        ]
    finally:
        loop.close()


def _drain(
    items: list[WorkItem], max_tokens: int, max_size: int, padding: PaddingBudget = PADDING_CPU
):
    batches, queue = [], items
    while queue:
        oldest = queue[0]
        batch, rest = take_batch(queue, max_tokens, max_size, padding)
        assert oldest in batch  # the oldest waiting text always goes next
        assert [it for it in queue if it in rest] == rest  # the rest keep arrival order
        batches.append(batch)
        queue = rest
    return batches


def test_batches_respect_padded_cost_count_and_padding() -> None:
    rng = random.Random(0)
    items = _items([rng.randint(3, 256) for _ in range(500)])
    for budget in (PADDING_CPU, PADDING_ACCELERATOR):
        batches = _drain(items, max_tokens=2048, max_size=32, padding=budget)
        assert sorted(id(it) for b in batches for it in b) == sorted(id(it) for it in items)
        for batch in batches:
            lengths = [it.item.cost for it in batch]
            padded = max(lengths) * len(batch)
            assert len(batch) <= 32
            assert len(batch) == 1 or padded <= 2048
            assert padded - sum(lengths) <= max(budget.tokens, budget.fraction * padded)
            assert lengths == sorted(lengths)


@pytest.mark.parametrize(
    ("budget", "max_padding", "min_mean_batch"),
    [(PADDING_CPU, 1.25, 4), (PaddingBudget(tokens=4, fraction=0.01), 1.02, 2.5)],
)
def test_mixed_requests_pad_little(
    budget: PaddingBudget, max_padding: float, min_mean_batch: float
) -> None:
    """Four requests of 32 random-length texts: padded together they cost ~2.6x."""
    rng = random.Random(1)
    lengths = [rng.randint(10, 165) for _ in range(128)]
    batches = _drain(_items(lengths), max_tokens=8192, max_size=32, padding=budget)
    padded = sum(max(it.item.cost for it in b) * len(b) for b in batches)
    assert padded <= max_padding * sum(lengths)
    assert sum(len(b) for b in batches) / len(batches) >= min_mean_batch  # not singles


def test_accelerator_slack_keeps_batches_large() -> None:
    rng = random.Random(2)
    lengths = [rng.randint(10, 165) for _ in range(64)]
    batches = _drain(_items(lengths), max_tokens=16384, max_size=32, padding=PADDING_ACCELERATOR)
    assert [len(b) for b in batches] == [32, 32]


def test_oversized_single_item_still_gets_a_batch() -> None:
    batches = _drain(_items([5000, 3]), max_tokens=1024, max_size=8)
    assert [len(b) for b in batches] == [1, 1]


def test_collate_right_pads_with_mask() -> None:
    batch = collate([Tokens([5, 6, 7], [0, 0, 0]), Tokens([8], [1])], pad_id=0)
    np.testing.assert_array_equal(batch.input_ids, [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(batch.attention_mask, [[1, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(batch.token_type_ids, [[0, 0, 0], [1, 0, 0]])
    assert batch.real_tokens == 4
    np.testing.assert_array_equal(batch.row_lengths(), [3, 1])


def test_collate_keeps_masked_positions_in_row_lengths() -> None:
    """ColBERT's query expansion: masked positions still count as the row's own."""
    query = Tokens([5, 6, 9, 9], [0] * 4, attention=[1, 1, 0, 0])
    batch = collate([query, Tokens([8, 7, 6, 5, 4], [0] * 5)], pad_id=0)
    np.testing.assert_array_equal(batch.attention_mask, [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(batch.row_lengths(), [4, 5])


class _Keyed:
    def __init__(self, cost: int, key: str) -> None:
        self.cost, self.key = cost, key


def test_items_with_different_shape_keys_never_share_a_batch() -> None:
    loop = asyncio.new_event_loop()
    try:
        keys = ["a", "b", "a", "b", "a"]
        items = [WorkItem(_Keyed(10, k), loop.create_future()) for k in keys]
    finally:
        loop.close()
    batches = _drain(items, max_tokens=1000, max_size=8)
    assert [[it.item.key for it in b] for b in batches] == [["a", "a", "a"], ["b", "b"]]


def test_cpu_forward_plan() -> None:
    from ember.cpu import cpu_forward_plan

    assert cpu_forward_plan(0, cores=2) == (2, 1)
    assert cpu_forward_plan(0, cores=4) == (4, 1)
    assert cpu_forward_plan(0, cores=16) == (4, 4)
    assert cpu_forward_plan(1, cores=2) == (1, 2)
    assert cpu_forward_plan(8, cores=2) == (2, 1)


class _SlowBackend:
    """Zeros after a delay; records when batches run."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.running = 0

    def run(self, items):  # type: ignore[no-untyped-def]
        import time

        self.running += 1
        time.sleep(self.delay)
        self.running -= 1
        return [np.zeros(4, dtype=np.float32) for _ in items]


def _started_batcher(backend: _SlowBackend, idle_trim_seconds: float, trim: Callable[[], object]):  # type: ignore[no-untyped-def]
    from ember.engine.batcher import Batcher
    from ember.metrics import Metrics

    batcher = Batcher(
        backend.run,
        name="m",
        max_batch_tokens=1024,
        max_batch_size=8,
        max_queue_size=64,
        metrics=Metrics(),
        idle_trim_seconds=idle_trim_seconds,
        trim=trim,
    )
    batcher.start()
    return batcher


async def test_heap_is_trimmed_once_per_idle_spell_never_mid_forward() -> None:
    backend = _SlowBackend(delay=0.6)
    trims: list[int] = []
    batcher = _started_batcher(backend, 0.1, lambda: trims.append(backend.running))
    try:
        await asyncio.sleep(0.3)
        assert trims == []  # nothing ran yet: nothing to trim
        futures = batcher.submit([Tokens([1, 2, 3], [0, 0, 0])])
        await asyncio.sleep(0.25)
        assert trims == []  # the queue sat empty past the idle wait, but a forward ran
        await asyncio.gather(*futures)
        await asyncio.sleep(0.6)
        assert trims == [0]  # idle after the forward: one trim, with no forward running
        await asyncio.sleep(0.3)
        assert trims == [0]  # still idle: not again
        await asyncio.gather(*batcher.submit([Tokens([1, 2], [0, 0])]))
        await asyncio.sleep(0.6)
        assert trims == [0, 0]  # a new idle spell after new work
    finally:
        await batcher.stop()


def test_release_freed_memory_reports_glibc() -> None:
    import platform

    from ember.engine.memory import release_freed_memory

    result = release_freed_memory()
    assert isinstance(result, bool)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        from ember.engine import memory

        assert memory._MALLOC_TRIM is not None


async def test_stop_is_not_lost_when_work_arrives_in_the_same_step() -> None:
    """stop() cancels the loop task while submit() wakes it: the task must still end."""
    batcher = _started_batcher(_SlowBackend(delay=0.0), 5.0, lambda: None)
    await asyncio.gather(*batcher.submit([Tokens([1, 2], [0, 0])]))
    await asyncio.sleep(0.05)  # the loop now waits for work or the idle trim
    batcher.submit([Tokens([1, 2], [0, 0])])  # wakes it in this step ...
    stopping = asyncio.ensure_future(batcher.stop())  # ... and stop() cancels it in the same one
    done, _ = await asyncio.wait({stopping}, timeout=3.0)  # a hang, not a speed, is the failure
    if not done:
        stopping.cancel()
    assert stopping in done


async def test_inputs_that_would_miss_their_deadline_fail_before_their_forward() -> None:
    """At the measured rate a batch of 8 takes 0.8 s: inputs whose request gives up sooner
    are failed (504) without running; those with time enough, or no deadline, run."""
    import time

    from ember.errors import RequestTimeout

    backend = _SlowBackend(delay=0.0)
    ran: list[int] = []
    real_run = backend.run

    def counting_run(items):  # type: ignore[no-untyped-def]
        ran.append(len(items))
        return real_run(items)

    backend.run = counting_run  # type: ignore[method-assign]
    batcher = _started_batcher(backend, 5.0, lambda: None)
    try:
        batcher.throughput.per_worker = 10.0  # 0.1 s per input in a forward
        soon = time.perf_counter() + 0.3
        doomed = batcher.submit([Tokens([1, 2], [0, 0])] * 4, deadline=soon)
        later = batcher.submit([Tokens([1, 2], [0, 0])] * 4, deadline=soon + 60)
        free = batcher.submit([Tokens([1, 2], [0, 0])] * 2)  # no deadline: warm-up, jobs
        for fut in doomed:
            with pytest.raises(RequestTimeout):
                await fut
        await asyncio.gather(*later, *free)
        assert sum(ran) == 6  # the doomed four never reached a forward
    finally:
        await batcher.stop()


def test_a_refused_priority_change_is_a_warning_not_a_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """--forward-nice is a hint: where the sandbox refuses setpriority (gVisor may), the
    forward threads must still start, or every forward would fail."""
    import os
    import sys

    from ember.cpu import lower_thread_priority

    if sys.platform != "linux":
        pytest.skip("thread nice values are Linux's")

    def refuse(*args: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "setpriority", refuse)
    with caplog.at_level("WARNING"):
        lower_thread_priority(10)
    assert "--forward-nice not applied" in caplog.text
