"""EngineArray: every served model, routed by the request's ``model`` field."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager

from ember.backends import load_backend
from ember.backends.base import Backend
from ember.callers import CALLER, may_use
from ember.capabilities import Capability
from ember.config import ServerSettings
from ember.defaults import CACHE_MAX_BYTES
from ember.engine.cache import EmbeddingCache
from ember.engine.engine import Engine
from ember.engine.residency import Residency, Slot
from ember.errors import BadRequest, NotFound
from ember.media.budget import MediaBudget
from ember.media.limits import MediaLimits
from ember.metrics import Metrics
from ember.models.catalogue import Residence, ResidencyLimits
from ember.models.spec import ModelSpec, ResolvedModel


class EngineArray:
    """All served models; routes a request's ``model`` field to its engine."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        *,
        metrics: Metrics | None = None,
        backend_loader: Callable[[ResolvedModel], Backend] = load_backend,
        cache_entries: int = 0,
        cache_max_bytes: int | None = None,
        residences: Sequence[Residence] | None = None,
        residency_limits: ResidencyLimits | None = None,
    ) -> None:
        """``cache_entries`` > 0: one embedding cache (``ember.engine.cache``) for every
        model, of that many entries and ``cache_max_bytes`` bytes at most (None: the
        setting's default). ``residences``: how each model stays loaded (default: loaded
        at start and pinned), within ``residency_limits`` (``ember.engine.residency``)."""
        self.metrics = metrics or Metrics()
        # One media budget for the server: every engine's downloads and decodes draw on it.
        limits = next((spec.media for spec in specs if spec.media is not None), MediaLimits())
        budget = MediaBudget(limits)
        self.cache = None
        if cache_entries:
            limit = cache_max_bytes or CACHE_MAX_BYTES
            self.cache = EmbeddingCache(cache_entries, limit, self.metrics)
        self._backend_loader = backend_loader
        self._media_budget = budget
        residences = residences or [Residence()] * len(specs)
        slots = [
            Slot(spec, r, self._engine(spec)) for spec, r in zip(specs, residences, strict=True)
        ]
        limits = residency_limits or ResidencyLimits()
        self.residency = Residency(slots, limits, self._engine, self.metrics)
        self.started = False

    def _engine(self, spec: ModelSpec) -> Engine:
        """A fresh, unstarted engine for ``spec``: one per load of the model."""
        return Engine(
            spec,
            metrics=self.metrics,
            backend_loader=self._backend_loader,
            media_budget=self._media_budget,
            cache=self.cache,
        )

    @property
    def engines(self) -> list[Engine]:
        """Every served model's engine, loaded or not (an unloaded one has no model)."""
        return [slot.engine for slot in self.residency.slots]

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> EngineArray:
        """The engines ``settings`` describe: their models, and the embedding cache."""
        served = settings.catalogue()
        return cls(
            [spec for spec, _ in served],
            cache_entries=settings.cache_entries,
            cache_max_bytes=settings.cache_max_bytes,
            residences=[residence for _, residence in served],
            residency_limits=settings.residency_limits(),
        )

    def begin_first_load(self) -> None:
        """Begin the first eager model's load before an event loop runs (``Residency``)."""
        self.residency.begin_first_load()

    async def start(self) -> None:
        """Load the eager models, one at a time (loading is memory- and CPU-bound)."""
        await self.residency.start()
        self.started = True

    async def stop(self) -> None:
        await self.residency.stop()
        self.started = False

    @property
    def ready(self) -> bool:
        """Every pinned model loaded and warm (all of them, unless a catalogue says)."""
        return self.residency.ready

    @asynccontextmanager
    async def serving(
        self, engine: Engine, keep_alive: float | None = None
    ) -> AsyncIterator[Engine]:
        """``engine``'s model loaded (a request for an unloaded one starts its load and
        waits) and held until the request ends; ``keep_alive``: the request's, seconds."""
        async with self.residency.serving(engine, keep_alive) as loaded:
            yield loaded

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.engines]

    def visible(self) -> list[Engine]:
        """The engines the request's API key may use (``ember.callers``; every one without
        keys): what the model listings (``/v1/models``, ``/info``) and the errors that name
        served models show it."""
        return [e for e in self.engines if may_use(e.name)]

    def _served(self) -> str:
        """The served models an error may name to this request's key."""
        return ", ".join(e.name for e in self.visible()) or "none this API key may use"

    def get(self, name: str | None) -> Engine:
        """One model: any name is accepted (as Infinity and TEI do). Several: exact match,
        or with no name the one model the request's API key may use. Forbidden when the
        key may not use it."""
        return _allowed(self._find(name))

    def _find(self, name: str | None) -> Engine:
        if len(self.engines) == 1:
            return self.engines[0]
        for engine in self.engines:
            if engine.name == name:
                return engine
        if not name and len(visible := self.visible()) == 1:
            return visible[0]  # a key limited to one model: no name means that one
        served = self._served()
        if not name:
            raise BadRequest(
                f"several models are served; set `model` to one of: {served}", param="model"
            )
        raise NotFound(f"model {name!r} is not served here; served models: {served}", param="model")

    def for_task(self, name: str | None, capability: Capability) -> Engine:
        """Like get(), but with no name and several models, pick the one that has
        ``capability`` (``embed`` counts any embedding output)."""
        if not name and len(self.engines) > 1:
            visible = self.visible()
            doing = [e for e in visible if e.model is not None and e.family.does(capability)]
            if len(doing) == 1:
                return _allowed(doing[0])
            if not doing and visible and all(e.model is not None for e in visible):
                # Naming one would not help: say so rather than ask for a name.
                raise BadRequest(
                    f"no served model does {capability} (served: {self._served()})",
                    param="model",
                )
        return self.get(name)

    def tokenizing(self, name: str | None) -> Engine:
        """Like get(), but with no name and several models, the first served model that
        tokenises (every loaded one does): ``/tokenize`` and ``/decode`` need no model."""
        if not name and len(self.engines) > 1:
            visible = self.visible() or self.engines  # none: the first, refused below
            loaded = [e for e in visible if e.processor is not None]
            # none loaded yet: its calls answer "still loading"
            return _allowed((loaded or visible)[0])
        return self.get(name)

    def capabilities(self, name: str | None) -> set[Capability]:
        """What the named model can do; with no name, what any loaded model can do."""
        if name:
            try:
                engine = self._find(name)
            except NotFound:
                return set()
            return set(engine.family.capabilities) if engine.model is not None else set()
        return {c for e in self.engines if e.model is not None for c in e.family.capabilities}

    def __getitem__(self, name: str) -> Engine:
        return self.get(name)

    def __iter__(self) -> Iterator[Engine]:
        return iter(self.engines)


def _allowed(engine: Engine) -> Engine:
    """``engine``, if the request's API key (``ember.callers.CALLER``) may use it."""
    caller = CALLER.get()
    if caller is not None:
        caller.check_model(engine.name)
    return engine
