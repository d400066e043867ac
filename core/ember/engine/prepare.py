"""Request items -> features, before they are queued: where each kind of preparation runs.

Text is tokenised on the event loop when small (cheaper than a thread hand-off) and on a
small pool when large, overlapping the forwards. Images and audio are fetched first
(``ember.media``: bounded, SSRF-checked), then decoded and preprocessed one item per
task on a pool of one thread per core (Pillow, soundfile and numpy release the GIL). The
request's deadline bounds both: downloads and decodes still running when it passes (or when
the client leaves, or another item failed) stop at their next check, and the request's
downloaded bytes leave the server's budget when it ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ember.capabilities import Modality
from ember.cpu import cpu_count, lower_thread_priority
from ember.media.budget import DecodeGuard, MediaBudget

T = TypeVar("T")

# Requests with at most this many characters (or token ids) are tokenised on the event
# loop: one sentence takes ~0.1 ms in the Rust tokenizer, less than handing it to a
# thread and back (a profile at 1 sentence x 32 clients spent more in that GIL handoff
# than in tokenising). Larger requests go to the pool and overlap with forwards.
INLINE_TOKENIZE_CHARS = 2048

# Nice levels the media pool's threads run below the event loop: under the forwards' own
# (``FORWARD_NICE``, 10), so that decoding a flood of images takes the cycles text forwards
# leave rather than the other way round. Measured on 2 cores (benchmarks/media_limits.py):
# text p99 beside 4 clients sending 8 images each was 2.7x unloaded with decoding at nice 0.
MEDIA_NICE = 15

Prepare = Callable[[], Awaitable[list[Any]]]


class Preparer:
    """One engine's preparation pools; the media pool is made for the first media item.
    ``media_budget`` is the server's (shared by its engines); without one, this engine's own."""

    def __init__(self, media_budget: MediaBudget | None = None) -> None:
        self._tokenize_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")
        self._media_pool: ThreadPoolExecutor | None = None
        self._media_budget = media_budget

    async def on_pool(self, work: Callable[[], T]) -> T:
        """``work`` on the tokenising pool (TEI's /tokenize details, large requests)."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, work)

    def tokenizing(self, tokenize: Callable[[], list[Any]], size: int) -> Prepare:
        """Tokenise inline when ``size`` (characters or ids) is small, else on the pool."""

        async def prepare() -> list[Any]:
            if size <= INLINE_TOKENIZE_CHARS:
                return tokenize()
            return await self.on_pool(tokenize)

        return prepare

    def media(
        self,
        items: Sequence[Any],
        modality: Modality,
        processor: Any,
        limits: Any,
        timeout: float,
    ) -> Prepare:
        """Fetch ``items``, then ``processor.image`` / ``processor.audio`` each on its own
        worker thread, overlapping the forwards that run meanwhile; all within ``timeout``
        (the request's) of starting, else ``asyncio.TimeoutError``."""
        from ember.media import fetch_all

        decode = getattr(processor, modality)
        if self._media_budget is None:
            self._media_budget = MediaBudget(limits)
        budget = self._media_budget

        async def fetch_and_decode(guard: DecodeGuard) -> list[Any]:
            request = budget.request(guard)
            try:
                data = await fetch_all(items, limits, budget=request)
                loop = asyncio.get_running_loop()
                pool = self._pool()
                jobs = [
                    loop.run_in_executor(pool, decode, d, i, guard, budget)
                    for i, d in enumerate(data)
                ]
                return list(await asyncio.gather(*jobs))
            finally:
                guard.stop()  # what still runs (cancelled, timed out, a sibling failed) ends
                request.release()

        async def prepare() -> list[Any]:
            guard = DecodeGuard(time.perf_counter() + timeout, timeout)
            return await asyncio.wait_for(fetch_and_decode(guard), timeout)

        return prepare

    def _pool(self) -> ThreadPoolExecutor:
        if self._media_pool is None:
            self._media_pool = ThreadPoolExecutor(
                max_workers=cpu_count(),
                thread_name_prefix="media",
                initializer=lower_thread_priority,
                initargs=(MEDIA_NICE,),
            )
        return self._media_pool

    def close(self) -> None:
        self._tokenize_pool.shutdown(wait=False, cancel_futures=True)
        if self._media_pool is not None:
            self._media_pool.shutdown(wait=False, cancel_futures=True)
