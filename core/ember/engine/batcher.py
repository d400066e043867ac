"""Token-budget dynamic batching in front of one backend.

Waiting items are taken in length order so padding stays small; a batch closes when
its padded cost (longest x count) would pass ``max_batch_tokens`` or it holds
``max_batch_size`` texts. The queue is bounded (429 past it). Items whose request was
cancelled or timed out are dropped before they reach a forward pass. A forward that
raises fails only the futures of its own batch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ember.backends.base import Backend, TokenBatch
from ember.engine.tokenizer import Tokens
from ember.errors import BackendFailure, Overloaded
from ember.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RowResult:
    """One text's output row plus where its time went."""

    row: np.ndarray
    queue_s: float
    forward_s: float


@dataclass(eq=False)
class WorkItem:
    tokens: Tokens
    future: asyncio.Future[RowResult]
    enqueued_at: float = field(default_factory=time.perf_counter)


def plan_batches(items: list[WorkItem], max_tokens: int, max_size: int) -> list[list[WorkItem]]:
    """Sort by length, then cut greedily under the padded-cost and count limits."""
    batches: list[list[WorkItem]] = []
    current: list[WorkItem] = []
    for item in sorted(items, key=lambda it: len(it.tokens)):
        longest = len(item.tokens)  # ascending order: the newcomer is the longest
        if current and (len(current) >= max_size or (len(current) + 1) * longest > max_tokens):
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    return batches


def pad_batch(tokens: list[Tokens], pad_id: int) -> TokenBatch:
    longest = max(len(t) for t in tokens)
    ids = np.full((len(tokens), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(tokens), longest), dtype=np.int64)
    types = np.zeros((len(tokens), longest), dtype=np.int64)
    for row, tok in enumerate(tokens):
        n = len(tok)
        ids[row, :n] = tok.ids
        mask[row, :n] = 1
        types[row, :n] = tok.type_ids
    return TokenBatch(input_ids=ids, attention_mask=mask, token_type_ids=types)


class Batcher:
    def __init__(
        self,
        backend: Backend,
        *,
        name: str,
        pad_id: int,
        max_batch_tokens: int,
        max_batch_size: int,
        max_queue_size: int,
        metrics: Metrics,
        workers: int = 1,
    ) -> None:
        self.backend = backend
        self.name = name
        self.pad_id = pad_id
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.metrics = metrics
        self._pending: list[WorkItem] = []
        self._in_flight = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        # As many forward passes at once as the backend runs in parallel (one per core on
        # a small CPU, one on a GPU); each gets its own thread.
        self.workers = max(1, workers)
        self._slots = asyncio.Semaphore(self.workers)
        self._executor = ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix=f"fwd-{name}"
        )

    @property
    def depth(self) -> int:
        return len(self._pending) + self._in_flight

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"batcher-{self.name}"
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for task in list(self._running):
            task.cancel()
        for item in self._pending:
            if not item.future.done():
                item.future.cancel()
        self._pending.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def submit(self, tokens: list[Tokens]) -> list[asyncio.Future[RowResult]]:
        if self.depth + len(tokens) > self.max_queue_size:
            self.metrics.rejected.labels(self.name).inc()
            raise Overloaded(
                f"model {self.name!r} has {self.depth} texts queued (limit "
                f"{self.max_queue_size}); retry later",
            )
        loop = asyncio.get_running_loop()
        items = [WorkItem(tok, loop.create_future()) for tok in tokens]
        self._pending.extend(items)
        self.metrics.queue_depth.labels(self.name).set(self.depth)
        self._wake.set()
        return [it.future for it in items]

    async def run_direct(self, batch: TokenBatch) -> np.ndarray:
        """Run a batch on the forward thread outside the queue (warm-up)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.backend.forward, batch)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            snapshot, self._pending = self._pending, []
            live = [it for it in snapshot if not it.future.done()]
            self._in_flight += len(live)
            for batch in plan_batches(live, self.max_batch_tokens, self.max_batch_size):
                await self._slots.acquire()  # a worker is free
                task = loop.create_task(self._forward(loop, batch))
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            self.metrics.queue_depth.labels(self.name).set(self.depth)

    async def _forward(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> None:
        live = [it for it in batch if not it.future.done()]  # cancelled while waiting
        self._in_flight -= len(batch) - len(live)
        if not live:
            self._slots.release()
            return
        arrays = pad_batch([it.tokens for it in live], self.pad_id)
        started = time.perf_counter()
        try:
            out = await loop.run_in_executor(self._executor, self.backend.forward, arrays)
        except Exception as exc:  # any backend error fails this batch only
            log.exception("forward pass failed for %d texts on %s", len(live), self.name)
            self.metrics.failed_batches.labels(self.name).inc()
            error = BackendFailure(f"inference failed for this batch: {type(exc).__name__}: {exc}")
            for it in live:
                if not it.future.done():
                    it.future.set_exception(error)
        else:
            forward_s = time.perf_counter() - started
            self.metrics.batch_size.labels(self.name).observe(len(live))
            self.metrics.batch_tokens.labels(self.name).observe(arrays.input_ids.size)
            for row, it in enumerate(live):
                if not it.future.done():
                    it.future.set_result(RowResult(out[row], started - it.enqueued_at, forward_s))
        finally:
            self._slots.release()
            self._in_flight -= len(live)
            self.metrics.queue_depth.labels(self.name).set(self.depth)
