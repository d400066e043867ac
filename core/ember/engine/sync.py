"""A blocking facade over the async engines, for plain scripts and notebooks.

The engines run on an ``EngineLoop`` (a daemon thread); each call is submitted there
and waited for, so a script with no event loop of its own can embed and rerank.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import numpy as np

from ember.capabilities import Capability
from ember.chunking import Chunking
from ember.config import ServerSettings, settings_from_env
from ember.engine.array import EngineArray
from ember.engine.engine import Engine
from ember.engine.loop import EngineLoop
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest
from ember.outputs import ChunkedScores, ChunkedVectors

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

    def embed_chunks(
        self,
        texts: Sequence[str],
        chunking: Chunking | None = None,
        *,
        model: str | None = None,
        **options: Any,
    ) -> ChunkedVectors:
        """Each text cut into chunks (``Chunking()``: at the model's length) and embedded:
        the chunks' vectors with their offsets (``spans``) and each text's aggregate
        (``documents``), as the routes' ``chunking`` field gives them."""
        request = EmbedRequest(list(texts), chunking=chunking or Chunking(), **options)
        output = self._serve(model, "embed", lambda e: e.embed(request)).output
        assert isinstance(output, ChunkedVectors)
        return output

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        raw_scores: bool = False,
        max_tokens_per_doc: int | None = None,
        max_chunks_per_doc: int | None = None,
    ) -> list[float]:
        """One relevance score per document, in the documents' order; with
        ``max_tokens_per_doc`` or ``max_chunks_per_doc``, each document's best chunk's
        (``rerank_chunks`` says which chunk)."""
        return [
            float(s)
            for s in self._rerank(
                query, documents, model, raw_scores, max_tokens_per_doc, max_chunks_per_doc
            ).values
        ]

    def rerank_chunks(
        self,
        query: str,
        documents: Sequence[str],
        *,
        model: str | None = None,
        raw_scores: bool = False,
        max_tokens_per_doc: int | None = None,
        max_chunks_per_doc: int | None = None,
    ) -> ChunkedScores:
        """Long documents reranked by their best chunk: each score with that chunk's
        index and offsets."""
        if max_tokens_per_doc is None and max_chunks_per_doc is None:
            raise ValueError("rerank_chunks needs max_tokens_per_doc or max_chunks_per_doc")
        scores = self._rerank(
            query, documents, model, raw_scores, max_tokens_per_doc, max_chunks_per_doc
        )
        assert isinstance(scores, ChunkedScores)
        return scores

    def _rerank(
        self,
        query: str,
        documents: Sequence[str],
        model: str | None,
        raw_scores: bool,
        max_tokens_per_doc: int | None,
        max_chunks_per_doc: int | None,
    ) -> Any:
        request = RerankRequest(
            query,
            list(documents),
            raw_scores=raw_scores,
            max_tokens_per_doc=max_tokens_per_doc,
            max_chunks_per_doc=max_chunks_per_doc,
        )
        return self._serve(model, "rerank", lambda e: e.rerank(request)).output

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
