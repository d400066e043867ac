"""Which served models are in memory: loads on first use, evictions, idle unloads.

A request for a model that is not loaded starts one load (single-flight: later requests
wait on the same one, up to --load-timeout). Loads run one at a time, so the process's
memory measured before and after a load is that model's (``ember.engine.memory``). Room
for a load is made by unloading the least recently used idle unpinned models until the
model fits --max-loaded and --memory-budget, its bytes estimated before (its last
measurement, or its weights on disk) and checked after: a load that measured more than
its estimate unloads more, or itself, so the sum of what loaded models hold never passes
the budget. A model with requests in flight (or waiting for it) is never unloaded.

The decisions (``make_room``, ``never_fits``, ``expired``) are pure: slots and limits
in, what to unload out, tested alone; ``Residency`` runs them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ember.engine.engine import Engine
from ember.engine.memory import limit_malloc_arenas, release_freed_memory, resident_bytes
from ember.errors import BadRequest, EmberError, NotReady, Unavailable
from ember.metrics import Metrics
from ember.models.catalogue import Residence, ResidencyLimits, weight_bytes
from ember.models.spec import ModelSpec

log = logging.getLogger(__name__)

Status = Literal["loaded", "loading", "unloaded", "failed"]
REAP_SECONDS = 1.0  # how often idle models are looked for


@dataclass(eq=False)
class Slot:
    """One served model's place: its engine (a fresh, unstarted one while unloaded) and
    what residency knows of it."""

    spec: ModelSpec
    residence: Residence
    engine: Engine
    status: Status = "unloaded"
    memory_bytes: int = 0  # attributed while resident (the estimate while loading)
    measured_bytes: int = 0  # the last load's measurement: the next load's estimate
    in_flight: int = 0  # requests using it or waiting for its load
    used_at: float = 0.0  # monotonic: least recently used, and idle deadlines
    last_used: float | None = None  # unix time, for /v1/models
    load_seconds: float | None = None
    keep_alive: float | None = None  # the last request's; None: the residence's idle_unload
    error: str | None = None
    loader: asyncio.Future | None = None
    draining: bool = False  # a load waits for it to go idle: new requests wait too
    early_before: int | None = None  # memory when its load began early (begin_first_load)

    @property
    def name(self) -> str:
        return self.spec.served_model_name or self.spec.model_id

    @property
    def resident(self) -> bool:
        return self.status in ("loaded", "loading")

    @property
    def pinned(self) -> bool:
        return self.residence.pin

    def idle_deadline(self) -> float | None:
        """When it unloads if nothing uses it: the last request's ``keep_alive`` (Ollama's
        meaning: negative is never), else its ``idle_unload``; None: never (pinned too)."""
        if self.pinned:
            return None
        keep = self.keep_alive if self.keep_alive is not None else self.residence.idle_unload
        if keep is None or keep < 0:
            return None
        return self.used_at + keep


def evictable(slot: Slot) -> bool:
    return slot.status == "loaded" and not slot.pinned and slot.in_flight == 0


def _fits(count: int, used: int, need: int, limits: ResidencyLimits) -> bool:
    if limits.max_loaded and count + 1 > limits.max_loaded:
        return False
    return not limits.memory_budget or used + need <= limits.memory_budget


def make_room(
    slots: Sequence[Slot],
    target: Slot,
    need: int,
    limits: ResidencyLimits,
    *,
    busy: bool = False,
) -> list[Slot] | None:
    """The slots to unload, least recently used first, so that ``target`` (``need``
    bytes) fits beside the rest; None when it cannot fit now (the rest is pinned, busy or
    loading). ``busy``: count models with requests in flight as if idle (which to drain)."""
    others = [s for s in slots if s is not target and s.resident]
    count, used = len(others), sum(s.memory_bytes for s in others)
    evict: list[Slot] = []
    candidates = [
        s for s in others if evictable(s) or (busy and s.status == "loaded" and not s.pinned)
    ]
    for slot in sorted(candidates, key=lambda s: s.used_at):
        if _fits(count, used, need, limits):
            break
        evict.append(slot)
        count, used = count - 1, used - slot.memory_bytes
    return evict if _fits(count, used, need, limits) else None


def never_fits(
    slots: Sequence[Slot], target: Slot, need: int, limits: ResidencyLimits
) -> str | None:
    """Why ``target`` cannot fit even once every unpinned model is unloaded; None if it can."""
    pinned = [s for s in slots if s is not target and s.resident and s.pinned]
    if limits.max_loaded and len(pinned) + 1 > limits.max_loaded:
        return f"{len(pinned)} pinned models fill --max-loaded {limits.max_loaded}"
    room = limits.memory_budget - sum(s.memory_bytes for s in pinned)
    if limits.memory_budget and need > room:
        return (
            f"it takes about {need} bytes and --memory-budget leaves {max(room, 0)} "
            "beside the pinned models"
        )
    return None


def expired(slots: Sequence[Slot], now: float) -> list[Slot]:
    """The idle models whose idle deadline has passed."""
    return [
        s
        for s in slots
        if evictable(s) and (deadline := s.idle_deadline()) is not None and deadline <= now
    ]


def _collect() -> None:
    gc.collect()


def _retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class Residency:
    """The served models' slots, and the loads and unloads that move them."""

    def __init__(
        self,
        slots: Sequence[Slot],
        limits: ResidencyLimits,
        make_engine: Callable[[ModelSpec], Engine],
        metrics: Metrics,
        *,
        meter: Callable[[], int] = resident_bytes,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``meter``: the process's memory now (bytes); ``clock``: monotonic seconds."""
        self.slots = list(slots)
        self.limits = limits
        self.metrics = metrics
        self._make_engine = make_engine
        self.meter = meter
        self._clock = clock
        self._lock = asyncio.Lock()  # one load or unload at a time
        self._changed = asyncio.Event()  # set when a model goes idle or unloads
        self._reaper: asyncio.Task | None = None
        # Called after each unload: a full collection, since an engine's objects hold
        # reference cycles that keep its runtime session (and its memory) alive until one
        # (200 cycles of three tiny models grew resident memory 10% without it); the server
        # also re-freezes its heap there. 0.17 s with torch imported, paid per unload.
        self.settle: Callable[[], None] = _collect
        if any(not s.pinned for s in self.slots):
            limit_malloc_arenas()

    # ---- facts ---------------------------------------------------------------------------
    def slot(self, engine: Engine) -> Slot:
        return next(s for s in self.slots if s.engine is engine or s.spec is engine.spec)

    def named(self, name: str) -> Slot | None:
        return next((s for s in self.slots if s.name == name or s.engine.name == name), None)

    @property
    def ready(self) -> bool:
        """Every pinned model loaded and warm: readiness counts pinned models only."""
        return bool(self.slots) and all(s.engine.ready for s in self.slots if s.pinned)

    def resident_total(self) -> int:
        return sum(s.memory_bytes for s in self.slots if s.resident)

    # ---- lifecycle -----------------------------------------------------------------------
    def begin_first_load(self) -> None:
        """Begin the first eager model's load now, with no event loop yet (``ember serve``
        calls it before it builds the HTTP app, which the load then overlaps); ``start``
        takes it over. Its memory is measured from here, so the server's own start in
        between (~20 MB of modules and routes) counts to it: done only where no
        ``--memory-budget`` is set, so that a budget's figures stay measured one load at a
        time."""
        first = next((s for s in self.slots if s.residence.eager), None)
        if first is None or self.limits.memory_budget or first.early_before is not None:
            return
        first.early_before = self.meter()
        first.engine.begin_load()

    async def start(self) -> None:
        """Load the eager models, in order; a pinned one that fails fails the start."""
        for slot in self.slots:
            if not slot.residence.eager:
                continue
            try:
                await self._wait_loaded(slot, None)  # as long as it takes (a download)
            except EmberError as exc:
                if slot.pinned:
                    raise
                log.error("model %s did not load at start: %s", slot.name, exc.message)
        if self._reaper is None and any(not s.pinned for s in self.slots):
            self._reaper = asyncio.ensure_future(self._reap_forever())

    async def stop(self) -> None:
        """Stop every engine; loads still running are cancelled first (a load runs as its
        own task, shielded from the requests that wait on it)."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        loaders = [s.loader for s in self.slots if s.loader is not None and not s.loader.done()]
        for loader in loaders:
            loader.cancel()
        await asyncio.gather(*loaders, return_exceptions=True)
        for slot in self.slots:
            await slot.engine.stop()
            slot.status, slot.memory_bytes = "unloaded", 0

    # ---- requests ------------------------------------------------------------------------
    @asynccontextmanager
    async def serving(
        self, engine: Engine, keep_alive: float | None = None
    ) -> AsyncIterator[Engine]:
        """``engine``'s model, loaded (waiting for its load if need be) and held: it is not
        unloaded until the request ends. ``keep_alive``: the request's, in seconds."""
        slot = self.slot(engine)
        if slot.status != "loaded" and slot.pinned and slot.residence.eager:
            # loaded at start, as --model-id models are: no request starts its load
            raise NotReady(f"model {slot.name!r} is still loading")
        if slot.draining:
            await self._drained(slot)
        slot.in_flight += 1
        try:
            if slot.status != "loaded":
                await self._wait_loaded(slot)
            self._touch(slot)
            yield slot.engine
        finally:
            slot.in_flight -= 1
            self._touch(slot)
            slot.keep_alive = keep_alive
            if slot.in_flight == 0:
                self._wake()
                if slot in expired([slot], self._clock()):  # keep_alive 0: unload now
                    asyncio.ensure_future(self._unload_if_idle(slot)).add_done_callback(_retrieved)

    async def _drained(self, slot: Slot) -> None:
        """Wait while a load waits for ``slot`` to go idle: otherwise a model that always
        has a request in flight would keep the load waiting until it timed out."""
        deadline = self._clock() + self.limits.load_timeout
        while slot.draining:
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, deadline - self._clock()))
            except asyncio.TimeoutError:
                raise Unavailable(
                    f"model {slot.name!r} is making room for another load; retry"
                ) from None

    async def load(self, name: str) -> Slot:
        """``POST /models/load``: load ``name`` if it is not loaded."""
        slot = self._by_name(name)
        slot.in_flight += 1
        try:
            await self._wait_loaded(slot)
            self._touch(slot)
        finally:
            slot.in_flight -= 1
        self._wake()
        return slot

    async def unload(self, name: str) -> Slot:
        """``POST /models/unload``: unload ``name`` now; refused for a pinned model and
        while requests use it."""
        slot = self._by_name(name)
        if slot.pinned:
            raise BadRequest(f"model {name!r} is pinned; it stays loaded", param="model")
        async with self._lock:
            if slot.in_flight:
                raise Unavailable(f"model {name!r} has {slot.in_flight} requests in flight; retry")
            if slot.status == "loaded":
                await self._unload(slot, "admin")
        return slot

    def _by_name(self, name: str) -> Slot:
        slot = self.named(name)
        if slot is None:
            served = ", ".join(s.name for s in self.slots)
            raise BadRequest(f"model {name!r} is not served here; served: {served}", param="model")
        return slot

    def _touch(self, slot: Slot) -> None:
        slot.used_at = self._clock()
        slot.last_used = time.time()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- loading -------------------------------------------------------------------------
    async def _wait_loaded(self, slot: Slot, timeout: float | None = -1.0) -> None:
        """Start ``slot``'s load unless one runs; wait for it up to ``timeout`` seconds
        (default --load-timeout; None: no bound)."""
        if slot.status == "loaded":
            return
        if slot.loader is None or slot.loader.done():
            slot.loader = asyncio.ensure_future(self._load(slot))
            slot.loader.add_done_callback(_retrieved)
        if timeout is not None and timeout < 0:
            timeout = self.limits.load_timeout
        try:
            await asyncio.wait_for(asyncio.shield(slot.loader), timeout)
        except asyncio.TimeoutError:
            raise Unavailable(
                f"model {slot.name!r} did not load within --load-timeout {timeout}s; retry"
            ) from None

    async def _load(self, slot: Slot) -> None:
        deadline = self._clock() + self.limits.load_timeout
        async with self._lock:
            if slot.status == "loaded":
                return
            path = Path(slot.spec.model_id)
            estimate = max(slot.measured_bytes, weight_bytes(path))
            await self._room(slot, estimate, deadline)
            slot.status, slot.memory_bytes, slot.error = "loading", estimate, None
            if slot.early_before is not None:  # begun by begin_first_load: measured from there
                before, slot.early_before = slot.early_before, None
                started = slot.engine.load_began or time.perf_counter()
            else:
                # What models unloaded before freed late (a runtime's threads exit after its
                # session is gone) goes back to the OS now: the measured "before" is then the
                # process without them, and freed heap does not pile up across loads (200
                # cycles of three tiny models grew resident memory 10-26% without this).
                release_freed_memory()
                before, started = self.meter(), time.perf_counter()
            try:
                await slot.engine.start()
            except BaseException as exc:
                self._failed(slot, exc)
                await self._reset(slot)
                raise
            slot.load_seconds = time.perf_counter() - started
            measured = max(0, self.meter() - before)
            slot.measured_bytes = measured
            await self._settle_measured(slot, max(estimate, measured))
            self.metrics.model_loads.labels(slot.name, "ok").inc()
            self.metrics.model_load_seconds.labels(slot.name).observe(slot.load_seconds)
            log.info(
                "model %s loaded in %.2fs, %d bytes (estimated %d)",
                slot.name,
                slot.load_seconds,
                slot.memory_bytes,
                estimate,
            )

    async def _room(self, slot: Slot, need: int, deadline: float) -> None:
        """Unload what ``slot`` needs gone to fit. Busy models it needs gone drain first:
        their requests in flight finish, new ones wait for the unload (then load again)."""
        try:
            while True:
                reason = never_fits(self.slots, slot, need, self.limits)
                if reason is not None:
                    raise Unavailable(f"model {slot.name!r} cannot load: {reason}")
                victims = make_room(self.slots, slot, need, self.limits)
                if victims is not None:
                    for victim in victims:
                        await self._unload(victim, "room")
                    return
                for drain in make_room(self.slots, slot, need, self.limits, busy=True) or []:
                    drain.draining = True
                changed = self._changed
                try:
                    await asyncio.wait_for(changed.wait(), max(0.0, deadline - self._clock()))
                except asyncio.TimeoutError:
                    raise Unavailable(
                        f"model {slot.name!r}: no room to load it within --load-timeout "
                        f"{self.limits.load_timeout:g}s (the loaded models are busy); retry"
                    ) from None
        finally:
            if any(s.draining for s in self.slots):
                for other in self.slots:
                    other.draining = False
                self._wake()

    async def _settle_measured(self, slot: Slot, measured: int) -> None:
        """Take the measurement: unload more if the model took more than estimated, or
        unload it and refuse if it does not fit at all. The sum never passes the budget:
        victims leave the account before the new figure enters it."""
        victims = make_room(self.slots, slot, measured, self.limits)
        if victims is None:
            budget = self.limits.memory_budget
            await self._unload(slot, "room")
            error = Unavailable(
                f"model {slot.name!r} took {measured} bytes loaded, more than --memory-budget "
                f"{budget} leaves beside the models in use"
            )
            self._failed(slot, error)
            raise error
        old = [self._detach(victim, "room") for victim in victims]
        slot.memory_bytes, slot.status = measured, "loaded"
        self._touch(slot)
        self.metrics.model_resident_bytes.labels(slot.name).set(measured)
        for engine in old:
            await self._stop(engine)

    def _failed(self, slot: Slot, exc: BaseException) -> None:
        slot.status, slot.memory_bytes = "failed", 0
        slot.error = exc.message if isinstance(exc, EmberError) else f"{type(exc).__name__}: {exc}"
        self.metrics.model_loads.labels(slot.name, "failed").inc()

    # ---- unloading -----------------------------------------------------------------------
    async def _unload_if_idle(self, slot: Slot) -> None:
        async with self._lock:
            if slot in expired([slot], self._clock()):
                await self._unload(slot, "idle")

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(REAP_SECONDS)
            for slot in expired(self.slots, self._clock()):
                await self._unload_if_idle(slot)

    async def _unload(self, slot: Slot, reason: str) -> None:
        old = self._detach(slot, reason)
        await self._stop(old)

    def _detach(self, slot: Slot, reason: str) -> Engine:
        """Take ``slot`` out of the account at once; its old engine, to stop."""
        old = slot.engine
        slot.engine = self._make_engine(slot.spec)
        slot.status, slot.memory_bytes, slot.draining = "unloaded", 0, False
        self.metrics.model_evictions.labels(slot.name, reason).inc()
        self.metrics.model_resident_bytes.labels(slot.name).set(0)
        log.info("model %s unloaded (%s)", slot.name, reason)
        return old

    async def _stop(self, engine: Engine) -> None:
        await engine.stop()
        del engine
        self.settle()
        release_freed_memory()
        self._wake()

    async def _reset(self, slot: Slot) -> None:
        """A failed load's engine, stopped and replaced by a fresh one."""
        old, slot.engine = slot.engine, self._make_engine(slot.spec)
        await old.stop()
        del old
        self.settle()
        release_freed_memory()
        self._wake()
