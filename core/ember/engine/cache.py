"""The embedding cache (``--cache-entries``, off by default): an exact-key LRU of finished
per-input embeddings, shared by every engine of an EngineArray, bounded by entries and bytes.

What it keeps per input is what the engine returns for it, before the HTTP layer formats it:
the float32 dense vector (after normalising and ``dimensions``), the multi-vector array or
the sparse vector, with the input's token count (so ``usage`` is the same on a hit). base64,
float and ``--embedding-dtype`` answers are all formatted from those rows, so one entry
serves every encoding, and a hit formats to the same bytes as the miss that stored it.

A key is (model identity, options, input): the identity names the served model and its
files (``model_identity``), the options are every argument of ``Engine.embed`` that changes
an output, and the input is the text itself (prompt applied; compared in full, never by a
hash), token ids as bytes, or the SHA-256 of an inline image or audio item (a data: URI or
raw bytes). An image or audio URL is never cached: what it points to may change. Rerank
and classify are not cached.

Identical misses at once compute once (single-flight): the first call to miss a key leads,
registering a flight for it; a call that misses the same key while that flight is up (another
request, or the same input twice in one request) waits for the leader's result instead
of computing it again (``ember_cache_merged_total``). The leader lands its result and
removes its flight in one step under the lock, so a newcomer finds either one. A leader that
fails or is cancelled lands no result: its waiters then compute the input themselves (counted
as misses too), never getting its error: an error of the leader's is about the leader's
request (its queue, its deadline, its input's position), and an error about the input itself
comes again, naming the waiter's own position. Cancelling a waiter leaves the flight alone; a
call finishes its own computation (and lands its flights) before it waits on anyone else's,
so two calls waiting on each other cannot deadlock. The flights table holds only inputs being
computed, and at most ``max_entries`` of them: past that a miss computes without a flight.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from ember.backends.artifacts import source_fingerprint
from ember.backends.base import BackendInfo
from ember.engine.result import Result, Timings
from ember.metrics import Metrics
from ember.models.spec import ResolvedModel
from ember.outputs import SparseVector, output_type

# What one entry costs beyond its vector's and input's own bytes: the LRU's link and dict
# slot, the key tuple, the entry object and the numpy array headers (about 400 bytes per
# entry measured with tracemalloc on CPython 3.11, checked by tests/unit/test_embedding_cache.py).
ENTRY_OVERHEAD = 512


@dataclass(frozen=True)
class CachedRow:
    """One input's finished embedding (arrays read-only) and its token count."""

    row: Any  # float32 ndarray [d] (dense) or [k, d] (multi), or a SparseVector
    tokens: int
    size: int  # bytes counted against --cache-max-bytes


# A flight's outcome: the leader's entry, or None when the leader has none to give (it
# failed or was cancelled): the waiter computes the input itself. A concurrent.futures
# Future, not an asyncio one: engines of one cache may run on different event loops.
Flight: TypeAlias = "Future[CachedRow | None]"


@dataclass(frozen=True)
class Lead:
    """This call computes the input and lands ``flight`` for whoever waits on it."""

    flight: Flight


@dataclass(frozen=True)
class Wait:
    """Another computation of the same input is under way: this call takes its result."""

    flight: Flight


# What ``claim`` found for one key: a hit, a flight to lead or to wait on, or None (compute
# it, nobody waits: no key, or the flights table is full).
Slot: TypeAlias = "CachedRow | Lead | Wait | None"


def _row_bytes(row: Any) -> int:
    if isinstance(row, SparseVector):
        return row.indices.nbytes + row.values.nbytes
    return int(row.nbytes)


def _frozen(array: np.ndarray) -> np.ndarray:
    own = np.array(array, copy=True)  # a row of a batch's array would pin the whole batch
    own.flags.writeable = False
    return own


def frozen_row(row: Any) -> Any:
    """A copy of ``row`` that the cache owns and nobody can change in place."""
    if isinstance(row, SparseVector):
        return SparseVector(_frozen(row.indices), _frozen(row.values))
    return _frozen(row)


def input_key(item: Any, modality: str) -> Hashable | None:
    """The input part of a key: a text itself, token ids as bytes, an inline media item's
    SHA-256; None (not cached) for a media URL."""
    if modality == "text":
        if isinstance(item, str):
            return item
        return np.asarray(item, dtype=np.int64).tobytes()
    if isinstance(item, (bytes, bytearray, memoryview)):
        return hashlib.sha256(item).digest()
    if isinstance(item, str) and item[:5].lower() == "data:":
        return hashlib.sha256(item.encode()).digest()
    return None


def _key_bytes(key: Hashable) -> int:
    item = key[-1] if isinstance(key, tuple) else key
    return sys.getsizeof(item)


def model_identity(model: ResolvedModel, backend: BackendInfo) -> str:
    """What a served model is, for the keys: its name, its files (the artifact cache's
    fingerprint: small files by content, weights by size and mtime) and what it was loaded
    as. A model reloaded from changed files, or another backend or dtype, shares no entry."""
    root = model.root or model.path
    sources = {str(root): source_fingerprint(root)}
    if not model.path.is_relative_to(root):  # a transformer kept outside the pipeline's own
        sources[str(model.path)] = source_fingerprint(model.path)
    facts = {
        "name": model.served_name,
        "path": str(model.path),
        "sources": sources,
        "revision": model.spec.revision,
        "backend": [backend.name, backend.device, backend.dtype, backend.details],
        "pooling": model.poolings,
        "normalize": model.normalize,
        "prompts": model.prompts,
        "default_prompt": model.default_prompt_name,
        "max_length": model.max_length,
        "hidden_size": model.hidden_size,
    }
    blob = json.dumps(facts, sort_keys=True, default=str).encode()
    return f"{model.served_name}:{hashlib.sha256(blob).hexdigest()[:24]}"


class EmbeddingCache:
    """An LRU of ``CachedRow`` by key, holding at most ``max_entries`` entries and
    ``max_bytes`` counted bytes; the least recently used go first, and the flights of the
    inputs being computed (at most ``max_entries``). Thread-safe (engines of one array may
    run on different loops in an embedding application)."""

    def __init__(self, max_entries: int, max_bytes: int, metrics: Metrics | None = None) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("an embedding cache holds at least one entry and one byte")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.metrics = metrics or Metrics()
        self._entries: OrderedDict[Hashable, CachedRow] = OrderedDict()
        self._flights: dict[Hashable, Flight] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def flights(self) -> int:
        """Inputs being computed that a miss of the same key would wait for."""
        return len(self._flights)

    def _get(self, key: Hashable | None) -> CachedRow | None:
        """The entry under ``key``, made the most recently used (the lock held)."""
        entry = None if key is None else self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def count(self, model: str, *, hits: int = 0, misses: int = 0, merged: int = 0) -> None:
        """Count lookups for ``model``: hits, misses (inputs computed) and merged misses."""
        for counter, n in (
            (self.metrics.cache_hits, hits),
            (self.metrics.cache_misses, misses),
            (self.metrics.cache_merged, merged),
        ):
            if n:
                counter.labels(model).inc(n)

    def lookup(self, model: str, keys: Sequence[Hashable | None]) -> list[CachedRow | None]:
        """The entry for each key (None: not cached, or a None key), each found one made
        the most recently used; hits and misses counted for ``model``. Reads only: ``claim``
        is the lookup that also joins or starts flights."""
        with self._lock:
            found = [self._get(key) for key in keys]
        hits = sum(entry is not None for entry in found)
        self.count(model, hits=hits, misses=sum(key is not None for key in keys) - hits)
        return found

    def claim(self, model: str, keys: Sequence[Hashable | None]) -> list[Slot]:
        """For each key: its entry (a hit), a flight to wait on (the same key being
        computed), a flight this call leads (a miss: land it with ``store`` or ``abandon``
        it, whatever happens), or None (compute it; nobody waits). A key repeated in
        ``keys`` leads once and waits on itself after."""
        slots: list[Slot] = []
        with self._lock:
            for key in keys:
                slot: Slot = self._get(key)
                if slot is None and key is not None:
                    flight = self._flights.get(key)
                    if flight is not None:
                        slot = Wait(flight)
                    elif len(self._flights) < self.max_entries:
                        flight = self._flights[key] = Future()
                        slot = Lead(flight)
                slots.append(slot)
        merged = sum(isinstance(slot, Wait) for slot in slots)
        hits = sum(isinstance(slot, CachedRow) for slot in slots)
        misses = sum(key is not None for key in keys) - hits - merged
        self.count(model, hits=hits, misses=misses, merged=merged)
        return slots

    def _ground(self, key: Hashable, flight: Flight | None) -> None:
        """Take ``flight`` off the table if it is ``key``'s (the lock held)."""
        if flight is not None and self._flights.get(key) is flight:
            del self._flights[key]

    def abandon(self, key: Hashable, flight: Flight) -> None:
        """A leader without a result (it failed, or was cancelled): its waiters compute
        the input themselves, and the next miss leads anew."""
        with self._lock:
            self._ground(key, flight)
        if not flight.done():
            flight.set_result(None)

    def store(
        self, key: Hashable, row: Any, tokens: int, flight: Flight | None = None
    ) -> CachedRow | None:
        """Keep a copy of ``row`` under ``key``, evicting the least recently used entries
        until both bounds hold; one larger than the whole byte bound is not kept. With the
        ``flight`` this call leads for ``key``: lands it in the same step as the entry goes
        in (its waiters get the copy, kept or not)."""
        size = _row_bytes(row) + _key_bytes(key) + ENTRY_OVERHEAD
        kept = size <= self.max_bytes
        if not kept and flight is None:
            return None
        entry = CachedRow(frozen_row(row), tokens, size)
        evicted = 0
        with self._lock:
            self._ground(key, flight)
            if kept:
                old = self._entries.pop(key, None)
                if old is not None:
                    self._bytes -= old.size
                self._entries[key] = entry
                self._bytes += size
                while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                    _, dropped = self._entries.popitem(last=False)
                    self._bytes -= dropped.size
                    evicted += 1
            count, held = len(self._entries), self._bytes
        if flight is not None and not flight.done():
            flight.set_result(entry)
        if evicted:
            self.metrics.cache_evictions.inc(evicted)
        self.metrics.cache_entries.set(count)
        self.metrics.cache_bytes.set(held)
        return entry if kept else None


Run = Callable[[list], Awaitable[Result]]


async def _landed(flight: Flight) -> CachedRow | None:
    """The flight's outcome, from any event loop. Shielded: cancelling this waiter must not
    cancel the flight, which the leader and every other waiter share."""
    return await asyncio.shield(asyncio.wrap_future(flight))


async def _compute(
    cache: EmbeddingCache,
    keys: Sequence[Hashable | None],
    slots: Sequence[Slot],
    run: Run,
    items: list,
    todo: list[int],
) -> Result:
    """``run`` the inputs at ``todo`` and store them, landing the flights they lead; a
    flight not landed (``run`` failed or was cancelled) is abandoned, so no waiter hangs."""
    leads = {i: slot.flight for i in todo if isinstance(slot := slots[i], Lead)}
    try:
        fresh = await run(items if len(todo) == len(items) else [items[i] for i in todo])
        for j, i in enumerate(todo):
            key = keys[i]
            if key is not None:
                cache.store(key, fresh.outputs[j], fresh.input_tokens[j], leads.pop(i, None))
    finally:
        for i, flight in leads.items():
            cache.abandon(keys[i], flight)  # type: ignore[arg-type]  # a Lead has a key
    return fresh


async def embed_through(
    cache: EmbeddingCache,
    model: str,
    identity: str,
    items: list,
    options: Mapping[str, Any],
    run: Run,
) -> Result:
    """``run(items)`` (``Engine.embed`` without the cache) for the inputs neither cached nor
    being computed already, the rest from the cache or from the computation under way,
    merged back in order. A request of only hits never reaches the batcher (its timings
    are zero); one whose inputs all miss, each once, returns ``run``'s result unchanged.
    ``options``: the call's output-changing arguments, ``output`` and ``modality`` among
    them."""
    if not items:
        return await run(items)
    modality, kind = options["modality"], output_type(options["output"])
    shared = tuple(sorted(options.items()))
    keys: list[Hashable | None] = []
    for item in items:
        part = input_key(item, modality)
        keys.append(None if part is None else (identity, shared, part))
    slots = cache.claim(model, keys)
    found: list[CachedRow | None] = [s if isinstance(s, CachedRow) else None for s in slots]
    todo = [i for i, slot in enumerate(slots) if slot is None or isinstance(slot, Lead)]
    fresh: Result | None = None
    if todo:  # first what this call leads: its waiters may be waiting on it
        fresh = await _compute(cache, keys, slots, run, items, todo)
        if len(todo) == len(items):
            return fresh
        for j, i in enumerate(todo):
            found[i] = CachedRow(fresh.outputs[j], fresh.input_tokens[j], 0)
    orphans: list[int] = []  # waited on a leader that had no result: compute them here
    for i, slot in enumerate(slots):
        if isinstance(slot, Wait):
            found[i] = await _landed(slot.flight)
            if found[i] is None:
                orphans.append(i)
    if orphans:
        cache.count(model, misses=len(orphans))
        again = await _compute(cache, keys, [None] * len(items), run, items, orphans)
        fresh = fresh or again
        for j, i in enumerate(orphans):
            found[i] = CachedRow(again.outputs[j], again.input_tokens[j], 0)
    done = [entry for entry in found if entry is not None]
    assert len(done) == len(items)  # each input a hit, computed here, or landed
    rows, tokens = [entry.row for entry in done], [entry.tokens for entry in done]
    return Result(
        kind.from_rows(rows),
        prompt_tokens=sum(tokens),
        timings=fresh.timings if fresh is not None else Timings(),
        input_tokens=tokens,
    )
