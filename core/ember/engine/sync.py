"""A blocking facade over the async engines, for plain scripts and notebooks.

The engines run on an ``EngineLoop`` (a daemon thread); each call is submitted there
and waited for, so a script with no event loop of its own can embed and rerank.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np

from ember.capabilities import Capability
from ember.config import ServerSettings, settings_from_env
from ember.engine.array import EngineArray
from ember.engine.engine import Engine
from ember.engine.loop import EngineLoop
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest

T = TypeVar("T")


class SyncEngineArray:
    """``with SyncEngineArray(model_id=...) as ember: ember.embed([...])``."""

    def __init__(self, settings: ServerSettings | None = None, **options: Any) -> None:
        self.settings = settings or settings_from_env(**options)
        self.engines = EngineArray.from_settings(self.settings)
        self.loop = EngineLoop()
        try:
            self._call(self.engines.start())
        except BaseException:
            self.close()
            raise

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run(coro)

    @property
    def models(self) -> list[str]:
        return self.engines.names

    def embed(
        self, texts: Sequence[str], *, model: str | None = None, **options: Any
    ) -> np.ndarray:
        """Vectors as float32 [n, dims], normalised when the model says so; ``options``
        are ``EmbedRequest``'s fields (``output``, ``prompt_name``, ``modality``, ...)."""
        request = EmbedRequest(list(texts), **options)
        return self._serve(model, "embed", lambda e: e.embed(request)).outputs

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        raw_scores: bool = False,
    ) -> list[float]:
        """One relevance score per document, in the documents' order."""
        request = RerankRequest(query, list(documents), raw_scores=raw_scores)
        result = self._serve(model, "rerank", lambda e: e.rerank(request))
        return [float(s) for s in result.outputs]

    def classify(
        self, texts: Sequence[str], *, model: str | None = None, raw_scores: bool = False
    ) -> list[list[dict]]:
        request = ClassifyRequest(list(texts), raw_scores=raw_scores)
        labels, _ = self._serve(model, "classify", lambda e: e.classify(request))
        return labels

    def _serve(self, model: str | None, task: Capability, call: Callable[[Engine], Any]) -> Any:
        """``call`` on the model's engine, loaded first if it loads on demand."""
        engine = self.engines.for_task(model, task)

        async def served() -> Any:
            async with self.engines.serving(engine) as loaded:
                return await call(loaded)

        return self._call(served())

    def close(self) -> None:
        if self.loop.loop.is_running():
            if self.engines.started:
                self._call(self.engines.stop())
            self.loop.close()

    def __enter__(self) -> SyncEngineArray:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
