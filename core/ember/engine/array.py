"""EngineArray: every served model, routed by the request's ``model`` field."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from ember.backends import load_backend
from ember.backends.base import Backend
from ember.callers import CALLER, may_use
from ember.capabilities import Capability
from ember.config import ServerSettings
from ember.defaults import CACHE_MAX_BYTES
from ember.engine.cache import EmbeddingCache
from ember.engine.engine import Engine
from ember.errors import BadRequest, NotFound
from ember.media.budget import MediaBudget
from ember.media.limits import MediaLimits
from ember.metrics import Metrics
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
    ) -> None:
        """``cache_entries`` > 0: one embedding cache (``ember.engine.cache``) for every
        model, of that many entries and ``cache_max_bytes`` bytes at most (None: the
        setting's default)."""
        self.metrics = metrics or Metrics()
        # One media budget for the server: every engine's downloads and decodes draw on it.
        limits = next((spec.media for spec in specs if spec.media is not None), MediaLimits())
        budget = MediaBudget(limits)
        self.cache = None
        if cache_entries:
            limit = cache_max_bytes or CACHE_MAX_BYTES
            self.cache = EmbeddingCache(cache_entries, limit, self.metrics)
        self.engines = [
            Engine(
                spec,
                metrics=self.metrics,
                backend_loader=backend_loader,
                media_budget=budget,
                cache=self.cache,
            )
            for spec in specs
        ]
        self.started = False

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> EngineArray:
        """The engines ``settings`` describe: their models, and the embedding cache."""
        return cls(
            settings.model_specs(),
            cache_entries=settings.cache_entries,
            cache_max_bytes=settings.cache_max_bytes,
        )

    async def start(self) -> None:
        for engine in self.engines:  # one at a time: loading is memory- and CPU-bound
            await engine.start()
        self.started = True

    async def stop(self) -> None:
        for engine in self.engines:
            await engine.stop()
        self.started = False

    @property
    def ready(self) -> bool:
        return bool(self.engines) and all(e.ready for e in self.engines)

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
