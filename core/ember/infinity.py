"""Infinity's Python API on Ember's engines.

A program written for Infinity (``infinity_emb`` 0.0.78) runs on Ember with one changed
line: ``from infinity_emb import AsyncEngineArray, EngineArgs`` becomes
``from ember.infinity import AsyncEngineArray, EngineArgs``. The classes keep Infinity's
names, keyword-only signatures and return shapes (``(results, usage)`` tuples); underneath
each ``AsyncEmbeddingEngine`` is one ``ember.engine.Engine``, so batching, backends and
heads are Ember's. ``EngineArgs`` maps through the same table as ``ember serve``'s
Infinity flags (``ember.infinity_options.INFINITY_OPTIONS``): ``engine="optimum"`` is the
onnx backend, and a field Ember has no equivalent for warns once what Ember does instead.

Where the numbers differ from Infinity's: ``usage`` counts tokens (Infinity counts
characters unless ``lengths_via_tokenize``); ``matryoshka_dim`` truncates and
re-normalises (Infinity only truncates); ``embedding_dtype`` int8/uint8 use fixed scales
(``ember.heads.quantize``) where Infinity calibrates on a downloaded text set; and
``image_embed`` / ``audio_embed`` go through Ember's fetching limits (no private addresses
unless ``EMBER_ALLOW_PRIVATE_URLS``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any

import numpy as np

from ember.capabilities import Modality
from ember.config import ServerSettings, settings_from_env
from ember.defaults import DEFAULT_MODEL_NAME
from ember.engine.engine import Engine
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest
from ember.engine.result import Result
from ember.families.base import Family
from ember.heads.quantize import encode_embeddings
from ember.metrics import Metrics
from ember.models.spec import ModelSpec
from ember.outputs import DenseVectors

log = logging.getLogger(__name__)

__all__ = [
    "AsyncEmbeddingEngine",
    "AsyncEngineArray",
    "EngineArgs",
    "OverloadStatus",
    "RerankReturnType",
]

# EngineArgs fields with no Ember setting: passed on (and so warned about) only when they
# differ from Infinity's own default, since a default is nothing the program asked for.
_NO_SETTING = (
    "model_warmup",
    "vector_disk_cache_path",
    "bettertransformer",
    "lengths_via_tokenize",
    "onnx_disable_optimize",
    "onnx_do_not_prefer_quantized",
)


def _image_bytes(image: Any) -> str | bytes:
    """A PIL image (which Infinity's image_embed takes too) as PNG bytes; URLs, data: URIs
    and bytes go to the engine as they are."""
    if hasattr(image, "save") and not isinstance(image, (str, bytes)):
        import io

        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()
    return image  # type: ignore[no-any-return]


def _plain(value: Any) -> Any:
    """Infinity's enums (or their names) as the strings the settings take."""
    return value.value if isinstance(value, Enum) else value


@dataclass(frozen=True, kw_only=True)
class EngineArgs:
    """Infinity's ``EngineArgs``: one model to serve, with Infinity's field names and
    defaults, except that an empty ``model_name_or_path`` is Ember's packaged model
    (Infinity's default, michaelfeil/bge-small-en-v1.5, needs the network)."""

    model_name_or_path: str = ""
    batch_size: int = 32
    revision: str | None = None
    trust_remote_code: bool = True
    engine: Any = "torch"
    model_warmup: bool = True
    vector_disk_cache_path: str | bool = ""
    device: Any = "auto"
    device_id: Any = field(default_factory=list)
    compile: bool = False
    bettertransformer: bool = True
    dtype: Any = "auto"
    pooling_method: Any = "auto"
    lengths_via_tokenize: bool = False
    embedding_dtype: Any = "float32"
    served_model_name: str = ""
    onnx_disable_optimize: bool = False
    onnx_do_not_prefer_quantized: bool = False

    def __post_init__(self) -> None:
        for name in ("engine", "device", "dtype", "pooling_method", "embedding_dtype"):
            object.__setattr__(self, name, str(_plain(getattr(self, name))))
        if not self.served_model_name:  # Infinity's rule: the id's last two parts
            name = self.model_name_or_path or DEFAULT_MODEL_NAME
            object.__setattr__(self, "served_model_name", "/".join(name.split("/")[-2:]))
        if self.revision == "":
            object.__setattr__(self, "revision", None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def copy(self) -> EngineArgs:
        return EngineArgs(**self.to_dict())

    def settings(self) -> ServerSettings:
        """Ember's settings for this model, through ember serve's table of Infinity flags
        (EMBER_* and INFINITY_* variables fill what the args do not say, as for the CLI)."""
        defaults = {f.name: f.default for f in fields(EngineArgs)}
        flags: dict[str, Any] = {
            "model_id": self.model_name_or_path or None,
            "served_model_name": self.served_model_name,
            "batch_size": self.batch_size,
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
            "engine": self.engine,
            "device": self.device,
            "dtype": self.dtype,
            "pooling_method": self.pooling_method,
            "compile": self.compile,
            "embedding_dtype": self.embedding_dtype,
        }
        for name in _NO_SETTING:
            if getattr(self, name) != defaults[name]:
                flags[name] = getattr(self, name)
        if "vector_disk_cache_path" in flags:  # the flag's name; a path or True is "on"
            flags["vector_disk_cache"] = bool(flags.pop("vector_disk_cache_path"))
        ids = self.device_id
        if ids:
            flags["device_id"] = ids if isinstance(ids, str) else ",".join(map(str, ids))
        return settings_from_env(infinity_flags={k: v for k, v in flags.items() if v is not None})


@dataclass
class RerankReturnType:
    """One reranked document, as Infinity returns it."""

    relevance_score: float
    document: str
    index: int


@dataclass
class OverloadStatus:
    queue_fraction: float
    queue_absolute: int
    results_absolute: int


class AsyncEmbeddingEngine:
    """Infinity's ``AsyncEmbeddingEngine`` over one Ember ``Engine``. Create it with
    ``from_args`` (or, as Infinity's deprecated form, with EngineArgs' fields as keywords);
    start it with ``await astart()`` or ``async with engine:``."""

    def __init__(
        self,
        model_name_or_path: str | None = None,
        _show_deprecation_warning: bool = True,
        *,
        _metrics: Metrics | None = None,
        **kwargs: Any,
    ) -> None:
        if _show_deprecation_warning:
            log.warning("AsyncEmbeddingEngine(...) is deprecated in Infinity; use from_args()")
        if model_name_or_path is not None:
            kwargs["model_name_or_path"] = model_name_or_path
        self._engine_args = engine_args = EngineArgs(**kwargs)
        settings = engine_args.settings()
        self._spec: ModelSpec = settings.model_specs()[0]
        for line in settings.compat_warnings:
            log.warning("%s", line)
        self._engine = Engine(self._spec, metrics=_metrics)
        self._kind: Family | None = None
        self.running = False

    @classmethod
    def from_args(
        cls, engine_args: EngineArgs, *, _metrics: Metrics | None = None
    ) -> AsyncEmbeddingEngine:
        return cls(**engine_args.to_dict(), _show_deprecation_warning=False, _metrics=_metrics)

    def __str__(self) -> str:
        return f"AsyncEmbeddingEngine(running={self.running}, {self._engine_args})"

    async def astart(self) -> None:
        """Load and warm the model (Ember always warms it: see ``model_warmup``)."""
        if not self.running:
            await self._engine.start()
            self.running = True

    async def astop(self) -> None:
        if self.running:
            self.running = False
            await self._engine.stop()

    async def __aenter__(self) -> AsyncEmbeddingEngine:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()

    def _assert_running(self) -> Engine:
        if not self.running:
            raise ValueError(
                "didn't start `AsyncEmbeddingEngine`; recommended use is via "
                "AsyncContextManager `async with engine: ..`"
            )
        return self._engine

    def overload_status(self) -> OverloadStatus:
        batcher = self._assert_running().batcher
        assert batcher is not None
        depth = batcher.depth
        return OverloadStatus(depth / batcher.max_queue_size, depth, depth)

    def is_overloaded(self) -> bool:
        """True when the queue holds ``max_queue_size`` inputs: the next request would get
        Ember's Overloaded (429 over HTTP)."""
        status = self.overload_status()
        return status.queue_fraction >= 1.0

    @property
    def is_running(self) -> bool:
        return self.running

    @property
    def capabilities(self) -> set[str]:
        """What the model does (``embed``, ``rerank``, ``classify``, and Ember's
        ``embed_sparse`` / ``embed_multi``), known from its files before it loads."""
        if self._engine.model is not None:
            return set(self._engine.family.capabilities)
        if self._kind is None:
            from ember.families.resolve import resolve_model

            self._kind = resolve_model(self._spec).family
        assert self._kind is not None
        return set(self._kind.capabilities)

    @property
    def engine_args(self) -> EngineArgs:
        return self._engine_args

    def _items(self, result: Result) -> list[Any]:
        """One array per item, in ``embedding_dtype`` (dense outputs, as /v1/embeddings)."""
        dtype = self._spec.embedding_dtype
        if isinstance(result.output, DenseVectors) and dtype != "float32":
            return encode_embeddings(result.output.vectors, [dtype])[dtype]
        return list(result.outputs)  # float32 rows; multi-vector or sparse: as returned

    async def embed(
        self, sentences: list[str], matryoshka_dim: int | None = None
    ) -> tuple[list[Any], int]:
        """(one vector per sentence, tokens used)."""
        request = EmbedRequest(list(sentences), dimensions=matryoshka_dim)
        result = await self._assert_running().embed(request)
        return self._items(result), result.prompt_tokens

    async def image_embed(
        self, *, images: list[Any], matryoshka_dim: int | None = None
    ) -> tuple[list[Any], int]:
        """(one vector per image, usage): images as URLs, data: URIs, bytes or PIL images."""
        return await self._media(list(map(_image_bytes, images)), "image", matryoshka_dim)

    async def audio_embed(
        self, *, audios: list[str | bytes], matryoshka_dim: int | None = None
    ) -> tuple[list[Any], int]:
        """(one vector per clip, usage): clips as URLs, data: URIs or encoded bytes."""
        return await self._media(list(audios), "audio", matryoshka_dim)

    async def _media(
        self, items: list[str | bytes], modality: Modality, matryoshka_dim: int | None
    ) -> tuple[list[Any], int]:
        request = EmbedRequest(items, modality=modality, dimensions=matryoshka_dim)
        result = await self._assert_running().embed(request)
        return self._items(result), result.prompt_tokens

    async def rerank(
        self,
        *,
        query: str,
        docs: list[str],
        raw_scores: bool = False,
        top_n: int | None = None,
    ) -> tuple[list[RerankReturnType], int]:
        """(documents best first, cut to ``top_n`` when it is positive; tokens used)."""
        request = RerankRequest(query, list(docs), raw_scores=raw_scores, scale="probability")
        result = await self._assert_running().rerank(request)
        scores = result.outputs
        order = np.argsort(-scores, kind="stable")
        ranked = [RerankReturnType(float(scores[i]), docs[i], int(i)) for i in order]
        if top_n is not None and top_n > 0:
            ranked = ranked[:top_n]
        return ranked, result.prompt_tokens

    async def classify(
        self, *, sentences: list[str], raw_scores: bool = False
    ) -> tuple[list[list[dict[str, Any]]], int]:
        """(per sentence every label with its score, best first; tokens used)."""
        request = ClassifyRequest(list(sentences), raw_scores=raw_scores)
        labels, result = await self._assert_running().classify(request)
        return labels, result.prompt_tokens


class AsyncEngineArray:
    """Infinity's ``AsyncEngineArray``: engines by served model name."""

    def __init__(self, engines: Iterable[AsyncEmbeddingEngine]) -> None:
        engines = list(engines)
        if not engines:
            raise ValueError("Engines cannot be empty")
        names = [e.engine_args.served_model_name for e in engines]
        if len(set(names)) != len(names):
            raise ValueError(f"Engines must have unique model names, got {names}")
        self.engines_dict = dict(zip(names, engines, strict=True))

    @classmethod
    def from_args(cls, engine_args_array: Iterable[EngineArgs]) -> AsyncEngineArray:
        metrics = Metrics()  # one registry for the array, as a server has
        engines = (AsyncEmbeddingEngine.from_args(a, _metrics=metrics) for a in engine_args_array)
        return cls(engines)

    def __iter__(self) -> Iterator[AsyncEmbeddingEngine]:
        return iter(self.engines_dict.values())

    def __getitem__(self, index_or_name: str | int) -> AsyncEmbeddingEngine:
        """By name or position; with one engine, any name resolves to it (as Infinity)."""
        engines = list(self.engines_dict.values())
        if len(engines) == 1:
            return engines[0]
        if isinstance(index_or_name, int):
            return engines[index_or_name]
        if index_or_name in self.engines_dict:
            return self.engines_dict[index_or_name]
        raise IndexError(
            f"Engine for model name `{index_or_name}` not found. "
            f"Available model names are {list(self.engines_dict)}"
        )

    async def astart(self) -> None:
        for engine in self:  # one at a time: loading is memory- and CPU-bound
            await engine.astart()

    async def astop(self) -> None:
        for engine in self:
            await engine.astop()

    def is_running(self) -> bool:
        return all(engine.is_running for engine in self)

    async def embed(
        self, *, model: str, sentences: list[str], matryoshka_dim: int | None = None
    ) -> tuple[list[Any], int]:
        return await self[model].embed(sentences, matryoshka_dim=matryoshka_dim)

    async def rerank(
        self,
        *,
        model: str,
        query: str,
        docs: list[str],
        raw_scores: bool = False,
        top_n: int | None = None,
    ) -> tuple[list[RerankReturnType], int]:
        return await self[model].rerank(query=query, docs=docs, raw_scores=raw_scores, top_n=top_n)

    async def classify(
        self, *, model: str, sentences: list[str], raw_scores: bool = False
    ) -> tuple[list[list[dict[str, Any]]], int]:
        return await self[model].classify(sentences=sentences, raw_scores=raw_scores)

    async def image_embed(
        self, *, model: str, images: list[Any], matryoshka_dim: int | None = None
    ) -> tuple[list[Any], int]:
        return await self[model].image_embed(images=images, matryoshka_dim=matryoshka_dim)

    async def audio_embed(
        self, *, model: str, audios: list[str | bytes], matryoshka_dim: int | None = None
    ) -> tuple[list[Any], int]:
        return await self[model].audio_embed(audios=audios, matryoshka_dim=matryoshka_dim)
