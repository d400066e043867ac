"""What runs off the event loop for a model, and at what priority: the batcher's unit of
work (``Piece``), one batch's collate-forward-heads, and loading a backend on a thread at
the forward priority (``--forward-nice``)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ember.backends.base import Backend
from ember.batch import Features, TokenBatch, Tokens
from ember.capabilities import Output
from ember.cpu import lower_thread_priority
from ember.heads.base import Head
from ember.outputs import Row
from ember.processors import TextProcessor

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Piece:
    """One input on its way through the batcher: its features (a text's tokens, an image's
    pixels...) and the head it wants."""

    features: Tokens | Features
    output: Output

    @property
    def cost(self) -> int:
        return self.features.cost

    @property
    def key(self) -> Hashable:
        return self.features.key


def run_batch(
    processor: TextProcessor,
    backend: Backend,
    heads: Mapping[Output, Head],
    pieces: Sequence[Piece],
) -> Sequence[Row]:
    """One batch on a forward thread: collate, forward, and each row's head."""
    batch = processor.collate([p.features for p in pieces])  # type: ignore[arg-type]
    first = pieces[0].output
    if isinstance(batch, TokenBatch) and all(p.output == first for p in pieces):
        reduction = getattr(heads[first], "reduction", None)  # dense heads have one
        if reduction is not None and (mode := reduction(batch)) is not None:
            batch = replace(batch, reduce=mode)
    outputs = backend.forward(batch)
    if all(p.output == first for p in pieces):
        return heads[first].split(outputs, batch, range(len(pieces)))
    results: list[Any] = [None] * len(pieces)  # every slot is filled below
    for output in {p.output for p in pieces}:
        rows = [i for i, p in enumerate(pieces) if p.output == output]
        for row, value in zip(rows, heads[output].split(outputs, batch, rows), strict=True):
            results[row] = value
    return results


def at_priority(work: Callable[[], T], nice: int, name: str) -> Future[T]:
    """``work()`` begun on a thread of its own at the forward priority: the pools a runtime
    starts while loading (ORT's, CTranslate2's) inherit it, as the batcher's threads do.
    Needs no event loop, so a load can begin before the server's loop runs."""
    pool = ThreadPoolExecutor(
        max_workers=1,
        thread_name_prefix=name,
        initializer=lower_thread_priority,
        initargs=(nice,),
    )
    try:
        return pool.submit(work)
    finally:
        pool.shutdown(wait=False)  # never block the caller on a load being abandoned
