"""Cost-budget dynamic batching in front of one model's forward pass.

The batcher sees only each item's ``cost`` (tokens for text; patches or frames for other
inputs) and shape ``key`` (items with different keys never share a batch); what an item
holds and how a batch runs is the engine's ``run`` callable (collate -> backend ->
heads), called on a forward thread.

A batch is formed only when a forward worker is free, from everything waiting then, so
items from different requests share batches. It is built around the oldest waiting item
(no item waits behind a stream of newer ones) from the items nearest to it in cost, and
it closes when its padded cost (largest x count; the sum of costs for a backend that runs
batches packed, with no padding) would pass ``max_batch_tokens``, it holds
``max_batch_size`` items, or its padding would pass the device's ``PaddingBudget``:
random-length requests padded together did 2.6x the real work on this corpus. The queue
is bounded (429 past it; 413 for a request larger than it). A request that ends (cancelled,
timed out, failed) stops counting in the depth at once, queued or in a forward pass, and
its queued items never reach a forward pass. A forward that raises fails only the futures
of its own batch.

Each item rides in its request's lane (``ember.lanes``): a batch holds one lane's items,
and the lane it comes from is ``ember.engine.shares``' pick (weighted fair share with
aging). A running forward is never pre-empted; a bulk batch's cost is capped instead
(``LanePolicy.bulk_batch_tokens``), so a query waits at most about one bulk batch. Items
of one lane are batched exactly as before, so requests that claim no lane see no change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from ember.backends.base import PaddingBudget
from ember.engine.admission import Batching, Throughput, decide
from ember.engine.memory import IDLE_TRIM_SECONDS, release_freed_memory
from ember.engine.shares import LanePolicy, Shares
from ember.errors import BackendFailure, Overloaded, PayloadTooLarge, RequestTimeout
from ember.lanes import Lane
from ember.logs import REQUEST_ID
from ember.metrics import Metrics

log = logging.getLogger(__name__)


class Schedulable(Protocol):
    """What the batcher reads of an item: its cost and its shape key."""

    @property
    def cost(self) -> int: ...

    @property
    def key(self) -> Hashable: ...


# Runs one batch (on a forward thread): items -> one result per item, in order.
RunBatch = Callable[[Sequence[Any]], Sequence[Any]]


@dataclass(frozen=True)
class RowResult:
    """One item's result plus where its time went."""

    row: Any
    queue_s: float
    forward_s: float
    batch_size: int = 0  # inputs in the batch it ran in
    batch_tokens: int = 0  # that batch's padded cost


@dataclass(eq=False)
class WorkItem:
    item: Schedulable
    future: asyncio.Future[RowResult]
    enqueued_at: float = field(default_factory=time.perf_counter)
    deadline: float | None = None  # perf_counter time its request gives up
    request_id: str | None = field(default_factory=REQUEST_ID.get)  # made in its request
    counted: bool = True  # in the depth: its request has not ended, nor its forward
    lane: Lane = Lane.DEFAULT  # its request's: every batch of a split request keeps it


# Padding a batch may carry before a forward of its own would be cheaper: a CPU forward
# has little fixed cost (a MiniLM batch of one ran at 0.7x the best batched rate), an
# accelerator's kernel launches and transfers are worth thousands of tokens. A backend
# may declare its own (ONNX Runtime on CPU does: see onnx_backend).
PADDING_CPU = PaddingBudget(tokens=64, fraction=0.1)
PADDING_ACCELERATOR = PaddingBudget(tokens=4096, fraction=0.1)


def padding_budget_for(device: str) -> PaddingBudget:
    return PADDING_CPU if device == "cpu" else PADDING_ACCELERATOR


# A batch whose real cost is at least this many tokens prices a token for admission
# (``Throughput.cost_per_second``): its forward's fixed cost is small beside its work. On
# CPU a forward's fixed cost is a fraction of a millisecond (a 256-token MiniLM batch takes
# several); on an accelerator a small batch costs about what a large one does, so only
# batches of half the batch budget count there.
REPRESENTATIVE_CPU_TOKENS = 256


def representative_tokens_for(device: str, max_batch_tokens: int) -> int:
    if device == "cpu":
        return min(REPRESENTATIVE_CPU_TOKENS, max_batch_tokens)
    return max(1, max_batch_tokens // 2)


# A bulk batch's padded cost cap: what a query arriving behind a running bulk batch waits
# for (no forward is pre-empted). On CPU a forward's fixed cost is small, so short bulk
# batches cost bulk little: MiniLM on a busy 2-core host took about 5 s a worker for a
# 2,048-token bulk batch (queries under bulk: p99 2.4 s) and 0.8 s for a 512-token one
# (p99 0.84 s, bulk still at 94% of its rate alone). An accelerator's batch of a quarter
# of the budget still fills it.
BULK_CPU_TOKENS = 512


def bulk_tokens_for(device: str, max_batch_tokens: int) -> int:
    if device == "cpu":
        return min(BULK_CPU_TOKENS, max_batch_tokens)
    return max(1, max_batch_tokens // 4)


def batch_cost(items: Sequence[Schedulable], padding: PaddingBudget) -> int:
    """The tokens a batch's forward computes: count x the longest, or, packed, the sum."""
    if padding.packed:
        return sum(it.cost for it in items)
    return len(items) * max(it.cost for it in items)


def take_batch(
    items: list[WorkItem], max_tokens: int, max_size: int, padding: PaddingBudget = PADDING_CPU
) -> tuple[list[WorkItem], list[WorkItem]]:
    """(the next batch, the rest in arrival order) from items in arrival order.

    Grows outwards from the oldest item in cost order, among the items that share its
    shape key, each step adding whichever neighbour pads less, while count, padded cost
    and padding stay within their limits. Packed (no padding), the oldest items that fit.
    """
    if not items:
        return [], []
    key = items[0].item.key
    if key is None and all(it.item.key is None for it in items):
        candidates = items
    else:
        candidates = [it for it in items if it.item.key == key]
    if padding.packed:
        taken_items = _fill(candidates, max_tokens, max_size)
    else:
        taken_items = _grow(candidates, max_tokens, max_size, padding)
    chosen = {id(it) for it in taken_items}
    return taken_items, [it for it in items if id(it) not in chosen]


def take_lane_batch(
    items: list[WorkItem],
    shares: Shares,
    max_tokens: int,
    max_size: int,
    padding: PaddingBudget = PADDING_CPU,
) -> tuple[Lane, list[WorkItem], list[WorkItem]]:
    """(the lane served, its next batch, the rest in arrival order): ``shares`` picks the
    lane among those waiting and is charged the batch; ``take_batch`` forms it from that
    lane's items alone, a bulk batch within ``LanePolicy.bulk_batch_tokens``."""
    if not items:
        return Lane.DEFAULT, [], []
    lane = shares.pick({it.lane for it in items})
    limit = shares.policy.batch_tokens(lane, max_tokens)
    own = [it for it in items if it.lane == lane]
    batch, _ = take_batch(own, limit, max_size, padding)
    shares.charge(lane, batch_cost([it.item for it in batch], padding))
    chosen = {id(it) for it in batch}
    return lane, batch, [it for it in items if id(it) not in chosen]


def _fill(items: list[WorkItem], max_tokens: int, max_size: int) -> list[WorkItem]:
    """A packed batch: lengths need not match, so the oldest items first, each that still
    fits in the token budget (the oldest always runs, however long)."""
    taken, total = [items[0]], items[0].item.cost
    for it in items[1:]:
        if len(taken) == max_size:
            break
        if total + it.item.cost <= max_tokens:
            taken.append(it)
            total += it.item.cost
    return taken


def _grow(
    items: list[WorkItem], max_tokens: int, max_size: int, padding: PaddingBudget
) -> list[WorkItem]:
    """The batch around ``items[0]`` (the oldest), in cost order."""
    lengths = [it.item.cost for it in items]
    order = sorted(range(len(items)), key=lengths.__getitem__)
    lo = hi = order.index(0)
    longest = real = lengths[0]
    count = 1
    while count < max_size:
        best: tuple[int, int] | None = None  # (padding, position in length order)
        for pos in (lo - 1, hi + 1):
            if 0 <= pos < len(order):
                length = lengths[order[pos]]
                padded = (count + 1) * max(longest, length)
                waste = padded - real - length
                if padded <= max_tokens and padding.allows(waste, padded):
                    best = min(best or (waste, pos), (waste, pos))
        if best is None:
            break
        pos = best[1]
        lo, hi = min(lo, pos), max(hi, pos)
        length = lengths[order[pos]]
        longest, real, count = max(longest, length), real + length, count + 1
    return [items[i] for i in order[lo : hi + 1]]  # already in cost order


class Batcher:
    # Forward passes running in this process, over every model: a heap trim waits for none.
    forwards_running = 0

    def __init__(
        self,
        run: RunBatch,
        *,
        name: str,
        max_batch_tokens: int,
        max_batch_size: int,
        max_queue_size: int,
        metrics: Metrics,
        workers: int = 1,
        padding: PaddingBudget = PADDING_CPU,
        idle_trim_seconds: float = IDLE_TRIM_SECONDS,
        trim: Callable[[], object] = release_freed_memory,
        thread_setup: Callable[[], object] | None = None,
        representative_tokens: int = REPRESENTATIVE_CPU_TOKENS,
        lanes: LanePolicy | None = None,
    ) -> None:
        """``thread_setup`` runs first on each forward thread (the engine lowers its
        priority there: ``ember.cpu.lower_thread_priority``); ``lanes``: how the priority
        lanes share the model (``ember.engine.shares``)."""
        self.run = run
        self.name = name
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_queue_size = max_queue_size
        self.padding = padding
        self.representative_tokens = representative_tokens
        self.metrics = metrics
        # this model's series, labelled once: admission and every queue change touch them
        self._depth_gauge = metrics.queue_depth.labels(name)
        self._rejected = metrics.rejected.labels(name)
        self.shares = Shares(lanes)
        self._lane_queued = [metrics.lane_queued_tokens.labels(name, ln.label) for ln in Lane]
        self._lane_wait = [metrics.lane_wait_seconds.labels(name, ln.label) for ln in Lane]
        self._lane_tokens = [metrics.lane_tokens.labels(name, ln.label) for ln in Lane]
        self.idle_trim_seconds = idle_trim_seconds
        self._trim = trim
        self._ran_since_trim = False
        self._pending: list[WorkItem] = []
        self._forwarding: list[list[WorkItem]] = []  # the batches in a forward pass now
        self._in_flight = 0  # their items still counted
        self._reserved = 0
        self.throughput = Throughput()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        # As many forward passes at once as the backend runs in parallel (one per core on
        # a small CPU, one on a GPU); each gets its own thread.
        self.workers = max(1, workers)
        self._slots = asyncio.Semaphore(self.workers)
        self._executor = ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix=f"fwd-{name}", initializer=thread_setup
        )

    @property
    def depth(self) -> int:
        """Inputs admitted and not yet answered: reserved, queued, in a forward pass."""
        return self._reserved + len(self._pending) + self._in_flight

    def admit(
        self, count: int, budget_s: float | None = None, costs: Sequence[float] | None = None
    ) -> None:
        """Reserve room for ``count`` inputs as a request arrives, before any of its work
        (tokenisation) is done. ``ember.engine.admission.decide`` refuses it at once: more
        inputs than the queue holds (413), a full queue, or inputs (``costs``: estimated,
        when known) that alone or behind the queue would take longer than the request's
        ``budget_s`` at the measured throughput (429)."""
        refused = decide(
            self.depth,
            count,
            budget_s,
            self.throughput,
            max_queued=self.max_queue_size,
            batch=Batching(self.max_batch_size, self.max_batch_tokens),
            costs=costs,
        )
        if refused is not None:
            self._rejected.inc()
            error = PayloadTooLarge if refused.status == 413 else Overloaded
            raise error(f"model {self.name!r}: {refused.reason}")
        self._reserved += count
        self._depth_gauge.set(self.depth)

    def release(self, count: int) -> None:
        """Give back a reservation whose inputs will not be submitted."""
        self._reserved = max(0, self._reserved - count)
        self._depth_gauge.set(self.depth)

    def drop(self, futures: Sequence[asyncio.Future[RowResult]]) -> None:
        """The request that owns ``futures`` has ended (its client left, it timed out, an
        input failed): cancel what of it has not run, and stop counting all of it now,
        queued or in a forward pass, so the depth, its gauge and admission say at once
        what is really waiting (a forward already running still finishes, for no one)."""
        ended = set(futures)
        for future in futures:
            if not future.done():
                future.cancel()
        self._pending = [it for it in self._pending if it.future not in ended]
        self._count_queued()
        for batch in self._forwarding:
            self._uncount(it for it in batch if it.future in ended)
        self._depth_gauge.set(self.depth)

    def _count_queued(self) -> None:
        """Set each lane's queued-tokens gauge from what is pending now."""
        queued = [0] * len(Lane)
        for it in self._pending:
            queued[it.lane] += it.item.cost
        for gauge, tokens in zip(self._lane_queued, queued, strict=True):
            gauge.set(tokens)

    def _uncount(self, items: Iterable[WorkItem]) -> None:
        """Stop counting ``items`` of a batch in a forward pass (once each)."""
        for it in items:
            if it.counted:
                it.counted = False
                self._in_flight -= 1

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
        self._count_queued()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def submit(
        self,
        work: Sequence[Schedulable],
        *,
        reserved: int = 0,
        deadline: float | None = None,
        lane: Lane = Lane.DEFAULT,
    ) -> list[asyncio.Future[RowResult]]:
        """Queue ``work``; ``reserved`` is what ``admit`` set aside for it; ``deadline``
        (``time.perf_counter``) is when its request gives up; ``lane``: its request's, kept
        by every batch its inputs run in."""
        self._reserved = max(0, self._reserved - reserved)
        if self.depth + len(work) > self.max_queue_size:
            self._rejected.inc()
            raise Overloaded(
                f"model {self.name!r}: {self.depth} inputs are queued (limit "
                f"{self.max_queue_size}); retry later",
            )
        loop = asyncio.get_running_loop()
        items = [WorkItem(it, loop.create_future(), deadline=deadline, lane=lane) for it in work]
        self._pending.extend(items)
        self._lane_queued[lane].inc(sum(it.cost for it in work))
        self._depth_gauge.set(self.depth)
        self._wake.set()
        return [it.future for it in items]

    async def run_direct(self, work: Sequence[Schedulable], measure: bool = False) -> Sequence[Any]:
        """Run a batch on a forward thread outside the queue (warm-up); ``measure``: count
        its time in the throughput, as a queued batch's is (a warm one: the first forward
        of a model also pays for allocating)."""
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        out = await loop.run_in_executor(self._executor, self.run, work)
        if measure:
            self._observe(work, started, time.perf_counter())
        return out

    def _observe(self, work: Sequence[Schedulable], started: float, ended: float) -> None:
        cost = sum(it.cost for it in work)
        representative = cost >= self.representative_tokens
        self.throughput.observe(len(work), started, ended, cost=cost, representative=representative)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                self._wake.clear()
                await self._until_work_or_idle(loop)
                continue
            await self._slots.acquire()  # a worker is free: batch what is waiting now
            live = [it for it in self._pending if not it.future.done()]
            lane, batch, self._pending = take_lane_batch(
                live, self.shares, self.max_batch_tokens, self.max_batch_size, self.padding
            )
            self._count_queued()
            formed = time.perf_counter()
            for it in batch:
                self._lane_wait[lane].observe(formed - it.enqueued_at)
            batch = self._without_doomed(batch)
            if not batch:
                self._slots.release()
                self._depth_gauge.set(self.depth)  # what was taken failed: not waiting
                continue
            self._in_flight += len(batch)
            self._forwarding.append(batch)
            self._ran_since_trim = True
            task = loop.create_task(self._forward(loop, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
            self._depth_gauge.set(self.depth)

    def _without_doomed(self, batch: list[WorkItem]) -> list[WorkItem]:
        """Fail, before their forward, the items whose request would give up before this
        batch ends (at the measured rate): computing them is work no one receives, and
        failing one fails its request at once, which drops its other queued inputs."""
        seconds = self.throughput.batch_seconds(len(batch))
        if seconds is None:
            return batch
        ends = time.perf_counter() + seconds
        kept = []
        for it in batch:
            if it.deadline is not None and it.deadline < ends:
                it.future.set_exception(
                    RequestTimeout(
                        f"model {self.name!r} could not answer before the request's deadline; "
                        "the server is saturated"
                    )
                )
            else:
                kept.append(it)
        return kept

    async def _until_work_or_idle(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait for work; once idle for ``idle_trim_seconds`` after some, trim the heap.

        The trim (about 20 ms for a torch MiniLM heap) runs only while no forward of any
        model runs; a request arriving during it may wait that long for the heap lock.
        """
        if not self._ran_since_trim:
            await self._wake.wait()
            return
        # asyncio.wait, not wait_for: on Python < 3.12 wait_for can swallow stop()'s
        # cancellation when the event fires in the same loop step.
        waiter = asyncio.ensure_future(self._wake.wait())
        try:
            done, _ = await asyncio.wait({waiter}, timeout=self.idle_trim_seconds)
        finally:
            waiter.cancel()
        if done or self._pending or Batcher.forwards_running:
            return  # work came, or forwards still run: look again after the next wait
        self._ran_since_trim = False
        loop.run_in_executor(None, self._trim)  # the default pool: no forward thread waits

    async def _forward(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> None:
        try:
            await self._forward_live(loop, batch)
        finally:
            self._forwarding.remove(batch)
            self._uncount(batch)
            self._slots.release()
            self._depth_gauge.set(self.depth)

    async def _forward_live(self, loop: asyncio.AbstractEventLoop, batch: list[WorkItem]) -> None:
        live = [it for it in batch if not it.future.done()]  # cancelled while waiting
        self._uncount(it for it in batch if it.future.done())
        if not live:
            return
        work = [it.item for it in live]
        started = time.perf_counter()
        Batcher.forwards_running += 1
        try:
            out = await loop.run_in_executor(self._executor, self.run, work)
        except Exception as exc:  # any backend error fails this batch only
            requests = sorted({it.request_id for it in live if it.request_id})
            log.exception(
                "forward pass failed for %d inputs on %s (requests %s)",
                len(live),
                self.name,
                ", ".join(requests) or "-",
            )
            self.metrics.failed_batches.labels(self.name).inc()
            error = BackendFailure(f"inference failed for this batch: {type(exc).__name__}: {exc}")
            for it in live:
                if not it.future.done():
                    it.future.set_exception(error)
        else:
            ended = time.perf_counter()
            forward_s = ended - started
            self._observe(work, started, ended)
            padded = batch_cost(work, self.padding)
            self.metrics.batch_size.labels(self.name).observe(len(live))
            self.metrics.batch_tokens.labels(self.name).observe(padded)
            self._lane_tokens[live[0].lane].inc(sum(it.cost for it in work))
            self._uncount(live)  # answered: out of the depth before their requests wake
            for row, it in enumerate(live):
                if not it.future.done():
                    it.future.set_result(
                        RowResult(out[row], started - it.enqueued_at, forward_s, len(live), padded)
                    )
        finally:
            Batcher.forwards_running -= 1
