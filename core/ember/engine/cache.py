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
"""

from __future__ import annotations

import hashlib
import json
import sys
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.backends.artifacts import source_fingerprint
from ember.backends.base import BackendInfo
from ember.engine.result import Result, Timings
from ember.heads.sparse import SparseVector
from ember.metrics import Metrics
from ember.models.spec import ResolvedModel

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
    ``max_bytes`` counted bytes; the least recently used go first. Thread-safe (engines of
    one array may run on different loops in an embedding application)."""

    def __init__(self, max_entries: int, max_bytes: int, metrics: Metrics | None = None) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("an embedding cache holds at least one entry and one byte")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.metrics = metrics or Metrics()
        self._entries: OrderedDict[Hashable, CachedRow] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def lookup(self, model: str, keys: Sequence[Hashable | None]) -> list[CachedRow | None]:
        """The entry for each key (None: not cached, or a None key), each found one made
        the most recently used; hits and misses counted for ``model``."""
        found: list[CachedRow | None] = []
        with self._lock:
            for key in keys:
                entry = None if key is None else self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                found.append(entry)
        hits = sum(entry is not None for entry in found)
        misses = sum(key is not None for key in keys) - hits
        if hits:
            self.metrics.cache_hits.labels(model).inc(hits)
        if misses:
            self.metrics.cache_misses.labels(model).inc(misses)
        return found

    def store(self, key: Hashable, row: Any, tokens: int) -> CachedRow | None:
        """Keep a copy of ``row`` under ``key``, evicting the least recently used entries
        until both bounds hold; one larger than the whole byte bound is not kept."""
        size = _row_bytes(row) + _key_bytes(key) + ENTRY_OVERHEAD
        if size > self.max_bytes:
            return None
        entry = CachedRow(frozen_row(row), tokens, size)
        evicted = 0
        with self._lock:
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
        if evicted:
            self.metrics.cache_evictions.inc(evicted)
        self.metrics.cache_entries.set(count)
        self.metrics.cache_bytes.set(held)
        return entry


Run = Callable[[list], Awaitable[Result]]


async def embed_through(
    cache: EmbeddingCache,
    model: str,
    identity: str,
    items: list,
    options: Mapping[str, Any],
    run: Run,
) -> Result:
    """``run(items)`` (``Engine.embed`` without the cache) for the inputs not cached, the
    rest from the cache, merged back in order. A request of only hits never reaches the
    batcher (its timings are zero); one of only misses returns ``run``'s result unchanged.
    ``options``: the call's output-changing arguments, ``output`` and ``modality`` among
    them."""
    if not items:
        return await run(items)
    modality, dense = options["modality"], options["output"] == "dense"
    shared = tuple(sorted(options.items()))
    keys: list[Hashable | None] = []
    for item in items:
        part = input_key(item, modality)
        keys.append(None if part is None else (identity, shared, part))
    found = cache.lookup(model, keys)
    todo = [i for i, entry in enumerate(found) if entry is None]
    fresh: Result | None = None
    if todo:
        fresh = await run(items if len(todo) == len(items) else [items[i] for i in todo])
        for j, i in enumerate(todo):
            key = keys[i]
            if key is not None:
                cache.store(key, fresh.outputs[j], fresh.input_tokens[j])
        if len(todo) == len(items):
            return fresh
    rows: list[Any] = []
    tokens: list[int] = []
    new = iter(range(len(todo)))
    for entry in found:
        if entry is not None:
            rows.append(entry.row)
            tokens.append(entry.tokens)
        else:
            assert fresh is not None
            j = next(new)
            rows.append(fresh.outputs[j])
            tokens.append(fresh.input_tokens[j])
    return Result(
        np.stack(rows) if dense else rows,
        prompt_tokens=sum(tokens),
        timings=fresh.timings if fresh is not None else Timings(),
        input_tokens=tokens,
    )
