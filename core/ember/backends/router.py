"""A sentence-transformers Router's backend: one backend per route, each batch to its own.

A batch holds one route's inputs (``TokenBatch.route``, set by
``ember.processors.router``). Each route was loaded as a model of its own
(``ember.backends.load_backend``): a transformer route on the backend asked for (``auto``:
chosen as for any model), a StaticEmbedding or IDF route on numpy, whatever was asked.
"""

from __future__ import annotations

from collections.abc import Mapping

from ember.backends.base import Backend, BackendDefaults, BackendInfo
from ember.batch import Batch, Outputs, TokenBatch


class RouterBackend(BackendDefaults):
    def __init__(self, backends: Mapping[str, Backend], main: str) -> None:
        self.backends = dict(backends)
        first = self.backends[main]  # the route with the network: its device and limits
        self.parallel_forwards = max(b.parallel_forwards for b in self.backends.values())
        self.padding = first.padding
        self.masked_positions = all(b.masked_positions for b in self.backends.values())
        limits = [b.max_length for b in self.backends.values() if b.max_length]
        self.max_length = min(limits) if limits else None
        sizes = [b.max_batch_size for b in self.backends.values() if b.max_batch_size]
        self.max_batch_size = min(sizes) if sizes else None
        names = dict.fromkeys(b.info.name for b in self.backends.values())
        details = {
            f"route {route}": " ".join(
                (b.info.name, *(f"{k}={v}" for k, v in b.info.details.items()))
            )
            for route, b in self.backends.items()
        }
        self.info = BackendInfo("+".join(names), first.info.device, first.info.dtype, details)

    def forward(self, batch: Batch) -> Outputs:
        assert isinstance(batch, TokenBatch) and batch.route is not None
        return self.backends[batch.route].forward(batch)

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()
