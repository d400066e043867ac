"""A backend that serves from the start on float32 and moves to the near-exact path once its
check, run on a thread beside serving, holds (``--near-exact-check background``).

Where the near-exact verdict is not cached, the check loads the bf16 candidate and runs the
probe before the model serves: 12 s of MiniLM's start on a busy 2-core host. A container
with no persistent ``/data`` (the slim image under Kubernetes, each new pod) pays that on
every start. Here the model is ready on the float32 reference at once; when the check
passes, the candidate is swapped in between batches: a batch runs wholly on the backend it
began on, and the reference closes after its last batch. Every answer is float32's or,
after the swap, within the near-exact tier's tolerance of it.
"""

from __future__ import annotations

import threading
from typing import Any

from ember.backends.base import Backend, BackendInfo


class Upgradable:
    """``reference`` until ``upgrade`` hands over a better backend for the same model (the
    batcher's plan, read once at start, stays the reference's)."""

    def __init__(self, reference: Backend) -> None:
        self._current = reference
        self._running: dict[int, int] = {}  # id(backend) -> its forwards running now
        self._retired: Backend | None = None  # the reference, until its last forward ends
        self._closed = False
        self._lock = threading.Lock()
        self.checked = threading.Event()  # set once the check is over, swapped in or not
        self.parallel_forwards = reference.parallel_forwards
        self.padding = reference.padding
        self.max_batch_size = reference.max_batch_size
        self.max_length = reference.max_length
        self.masked_positions = reference.masked_positions

    @property
    def info(self) -> BackendInfo:
        """What serves now: /v1/models and /info follow the swap."""
        return self._current.info

    @info.setter
    def info(self, value: BackendInfo) -> None:
        self._current.info = value

    def forward(self, batch: Any) -> Any:
        with self._lock:
            backend = self._current
            self._running[id(backend)] = self._running.get(id(backend), 0) + 1
        try:
            return backend.forward(batch)
        finally:
            with self._lock:
                self._running[id(backend)] -= 1
                done = backend is self._retired and not self._running[id(backend)]
                if done:
                    self._retired = None
            if done:
                backend.close()

    def upgrade(self, better: Backend) -> bool:
        """Serve ``better`` from the next batch on; False (and ``better`` closed) where the
        backend was closed meanwhile (the model unloaded, the server stopping)."""
        with self._lock:
            if self._closed:
                old = better
            else:
                old, self._current = self._current, better
                if self._running.get(id(old)):
                    self._retired, old = old, None  # closed by its last forward
        if old is not None:
            old.close()
        self.checked.set()
        return old is not better

    @property
    def closed(self) -> bool:
        return self._closed

    def settled(self) -> None:
        """The check is over and the reference stays."""
        self.checked.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            current, retired, self._retired = self._current, self._retired, None
        current.close()
        if retired is not None:
            retired.close()
