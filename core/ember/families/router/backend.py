"""A sentence-transformers Router's backend: one backend per route, each batch to its own.

A batch holds one route's inputs (``TokenBatch.part``, set by ``processor.py``). Each
route is loaded as a model of its own (``load_routes``, the family's ``load`` hook, given
``ember.backends.load_backend``): a transformer route on the backend asked for (``auto``:
chosen as for any model), a StaticEmbedding or IDF route on numpy, whatever was asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from ember.backends.base import Backend, BackendDefaults, BackendInfo
from ember.batch import Batch, Outputs, TokenBatch
from ember.families.router.facts import Routes
from ember.models.spec import ResolvedModel


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
        assert isinstance(batch, TokenBatch) and batch.part is not None
        return self.backends[batch.part].forward(batch)

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()


def load_routes(model: ResolvedModel, load: Callable[[ResolvedModel], Backend]) -> Backend:
    """Each route loaded (``load``: ``ember.backends.load_backend``) as a model of its own,
    on the backend asked for, or on the one backend that alone runs its family (numpy for
    a StaticEmbedding or IDF route, whatever the transformer route runs on)."""
    routes = model.facts
    assert isinstance(routes, Routes)
    loaded: dict[str, Backend] = {}
    try:
        for route, sub in routes.models.items():
            if only := sub.family.only_backend:
                sub = replace(sub, spec=replace(sub.spec, backend=only))
            loaded[route] = load(sub)
    except BaseException:
        for backend in loaded.values():
            backend.close()
        raise
    networks = [r for r, s in routes.models.items() if not s.family.only_backend]
    main = routes.document or routes.default
    return RouterBackend(loaded, main if main in networks or not networks else networks[0])
