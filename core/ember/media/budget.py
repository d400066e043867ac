"""What media may cost server-wide and per request, held before the cost is paid.

``MediaBudget`` is one per server (the ``EngineArray`` shares it between engines): download
slots, bytes downloaded and not yet decoded, and pixels being decoded. ``RequestBudget`` is
one request's share: its own download slots and byte total, and the ``DecodeGuard`` that
stops its decoding when its deadline passes or its client leaves.

Without these, a request's 2,048 URLs each up to ``--max-media-bytes`` were accepted
(~46 GiB at 10 MB each), 8 requests x 500 URLs to a tarpit held 2,528 sockets, and twelve
6000 x 6000 images decoded at once took RSS to 2.8 GiB.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from ember.errors import EmberError, PayloadTooLarge, RequestTimeout, Unavailable
from ember.media.limits import MediaLimits

# How often a decode waiting for pixel room looks at its deadline and its client.
WAIT_POLL_SECONDS = 0.05


class ClientGone(EmberError):
    """The request was cancelled (its client left): its decoding stops; nobody reads this."""

    status_code = 499


class DecodeGuard:
    """One request's decoding: checked between reads of an image and between stages, on
    worker threads, so a passed deadline or a client that left stops the work."""

    def __init__(self, deadline: float, timeout: float) -> None:
        self.deadline = deadline  # time.perf_counter() seconds
        self.timeout = timeout  # the request timeout, for the message
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def check(self) -> None:
        if self._stopped.is_set():
            raise ClientGone("the request was cancelled")
        if self.left() <= 0:
            raise RequestTimeout(
                f"request took more than {self.timeout:g}s, decoding its media included"
            )


class MediaBudget:
    """Server-wide media budgets; the async parts are made on first use, in the server's loop."""

    def __init__(self, limits: MediaLimits) -> None:
        self.limits = limits
        self._fetches: asyncio.Semaphore | None = None
        self.fetched_bytes = 0  # changed on the event loop only
        self.decoding_pixels = 0
        self._pixels = threading.Condition()

    def request(self, guard: DecodeGuard | None = None) -> RequestBudget:
        return RequestBudget(self, guard)

    def fetch_slots(self) -> asyncio.Semaphore:
        if self._fetches is None:
            self._fetches = asyncio.Semaphore(self.limits.max_fetches)
        return self._fetches

    @contextmanager
    def decoding(self, pixels: int, guard: DecodeGuard | None) -> Iterator[None]:
        """Hold ``pixels`` of the decode budget (on a worker thread) while decoding; wait for
        room until the request's deadline, or until its client leaves."""
        pixels = min(pixels, self.limits.max_decoding_pixels)
        with self._pixels:
            while self.decoding_pixels + pixels > self.limits.max_decoding_pixels:
                if guard is not None:
                    guard.check()
                self._pixels.wait(WAIT_POLL_SECONDS)
            self.decoding_pixels += pixels
        try:
            yield
        finally:
            with self._pixels:
                self.decoding_pixels -= pixels
                self._pixels.notify_all()


class RequestBudget:
    """One request's downloads: at most ``max_request_fetches`` at once (and a server-wide
    slot each), ``max_request_bytes`` in all; downloaded bytes count server-wide until
    ``release``."""

    def __init__(self, server: MediaBudget, guard: DecodeGuard | None = None) -> None:
        self.server = server
        self.limits = server.limits
        self.guard = guard
        self.bytes = 0
        self.held = 0  # this request's share of the server's fetched bytes
        self._slots = asyncio.Semaphore(self.limits.max_request_fetches)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        async with self._slots, self.server.fetch_slots():
            yield

    def charge(self, index: int, size: int, *, downloaded: bool) -> None:
        """Count ``size`` more bytes of input ``index``: 413 past the request's total, 503
        past the server's budget for downloads held."""
        self.bytes += size
        if self.bytes > self.limits.max_request_bytes:
            raise PayloadTooLarge(
                f"input {index}: the request's media pass the "
                f"{self.limits.max_request_bytes:,} bytes accepted in all",
                param="input",
            )
        if downloaded:
            server = self.server
            if server.fetched_bytes + size > self.limits.max_fetched_bytes:
                raise Unavailable(
                    f"input {index}: the server holds {server.fetched_bytes:,} bytes of "
                    "downloads waiting to be decoded, its budget "
                    f"({self.limits.max_fetched_bytes:,}); retry later"
                )
            server.fetched_bytes += size
            self.held += size

    def release(self) -> None:
        """The request's downloads are decoded (or dropped): their bytes leave the budget."""
        self.server.fetched_bytes -= self.held
        self.held = 0
