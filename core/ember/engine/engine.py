"""Engine: one served model's async API; EngineArray: route by served name."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ember.backends import load_backend
from ember.backends.base import Backend
from ember.engine.batcher import Batcher, pad_batch, padding_budget_for
from ember.engine.tokenizer import Direction, TextTokenizer, Tokens
from ember.errors import BadRequest, NotFound, NotReady, RequestTimeout
from ember.metrics import Metrics
from ember.models.resolve import resolve_model
from ember.models.spec import ModelSpec, ResolvedModel, Task
from ember.tasks import postprocess

log = logging.getLogger(__name__)

TASK_NOUNS = {"embed": "embeddings", "rerank": "reranking", "classify": "classification"}

# Requests with at most this many characters (or token ids) are tokenised on the event
# loop: one sentence takes ~0.1 ms in the Rust tokenizer, less than handing it to a
# thread and back (a profile at 1 sentence x 32 clients spent more in that GIL handoff
# than in tokenising). Larger requests go to the pool and overlap with forwards.
INLINE_TOKENIZE_CHARS = 2048
CPU_WARM_UP_LENGTH = 64


@dataclass
class Timings:
    """Seconds per stage for one request; exposed as TEI-style response headers."""

    tokenize: float = 0.0
    queue: float = 0.0
    forward: float = 0.0


@dataclass
class Result:
    """What an engine call returns: per-input outputs plus accounting."""

    outputs: np.ndarray
    prompt_tokens: int
    timings: Timings = field(default_factory=Timings)


class Engine:
    def __init__(
        self,
        spec: ModelSpec,
        *,
        metrics: Metrics | None = None,
        backend_loader: Callable[[ResolvedModel], Backend] = load_backend,
    ) -> None:
        self.spec = spec
        self.metrics = metrics or Metrics()
        self._backend_loader = backend_loader
        self.model: ResolvedModel | None = None
        self.backend: Backend | None = None
        self.tokenizer: TextTokenizer | None = None
        self.batcher: Batcher | None = None
        self._tokenize_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")
        self.ready = False
        self.load_seconds = 0.0
        self.warmup_seconds = 0.0

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Resolve, load and warm up; returns when the model can serve."""
        if self.ready:
            return
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        model = await loop.run_in_executor(None, resolve_model, self.spec)
        backend = await loop.run_in_executor(None, self._backend_loader, model)
        self.model, self.backend = model, backend
        static_batch = getattr(backend, "max_batch_size", None)
        static_length = getattr(backend, "max_length", None)
        self.tokenizer = await loop.run_in_executor(None, TextTokenizer, model, static_length)
        max_batch_size = min(self.spec.max_batch_size, static_batch or self.spec.max_batch_size)
        self.batcher = Batcher(
            backend,
            name=model.served_name,
            pad_id=self.tokenizer.pad_id,
            max_batch_tokens=self.spec.max_batch_tokens,
            max_batch_size=max_batch_size,
            max_queue_size=self.spec.max_queue_size,
            metrics=self.metrics,
            workers=getattr(backend, "parallel_forwards", 1),
            padding=getattr(backend, "padding", None) or padding_budget_for(backend.info.device),
        )
        self.batcher.start()
        self.load_seconds = time.perf_counter() - started
        await self._warm_up()
        self.ready = True
        log.info(
            "model %s ready: task=%s backend=%s device=%s dtype=%s forwards=%d "
            "load=%.2fs warm-up=%.2fs",
            model.served_name,
            model.task,
            backend.info.name,
            backend.info.device,
            backend.info.dtype,
            self.batcher.workers,
            self.load_seconds,
            self.warmup_seconds,
        )

    async def _warm_up(self) -> None:
        """One batch per forward worker, then one real request.

        On an accelerator the batch has the largest shape the batcher can form, so running
        out of device memory shows at start, not under load. On CPU memory grows on demand
        and kernels are not shape-specialised, and a largest-shape batch was 80% of the
        cold start (4.4 of 5.5 s for MiniLM on ct2), so a small one warms the threads.
        """
        assert self.batcher and self.tokenizer and self.backend
        started = time.perf_counter()
        length = self.tokenizer.max_length
        count = max(1, min(self.batcher.max_batch_size, self.spec.max_batch_tokens // length))
        if self.backend.info.device == "cpu":
            length, count = min(length, CPU_WARM_UP_LENGTH), 1
        filler = Tokens([self.tokenizer.pad_id + 1] * length, [0] * length)
        largest = pad_batch([filler] * count, self.tokenizer.pad_id)
        # Once per forward worker at the same time, so every worker thread is warm too.
        await asyncio.gather(
            *(self.batcher.run_direct(largest) for _ in range(self.batcher.workers))
        )
        if self.task == "embed":
            await self.embed(["warm-up"])
        elif self.task == "rerank":
            await self.rerank("warm-up", ["warm-up"])
        else:
            await self.classify(["warm-up"])
        self.warmup_seconds = time.perf_counter() - started

    async def stop(self) -> None:
        self.ready = False
        if self.batcher:
            await self.batcher.stop()
        if self.backend:
            self.backend.close()
        self._tokenize_pool.shutdown(wait=False, cancel_futures=True)

    # ---- facts -----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.model.served_name if self.model else (self.spec.served_model_name or "")

    @property
    def task(self) -> Task:
        assert self.model is not None, "engine not started"
        return self.model.task

    def require(self, task: Task) -> ResolvedModel:
        if self.batcher is None or self.model is None:
            raise NotReady(f"model {self.name!r} is still loading")
        if self.model.task != task:
            raise BadRequest(
                f"model {self.name!r} does not do {TASK_NOUNS[task]}; it serves "
                f"{TASK_NOUNS[self.model.task]} (/{_route_hint(self.model.task)})",
                param="model",
            )
        return self.model

    # ---- the calls -------------------------------------------------------------------------
    async def embed(
        self,
        inputs: Sequence[str] | Sequence[Sequence[int]],
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
        truncate: bool = True,
        truncation_direction: Direction = "right",
        prompt_name: str | None = None,
    ) -> Result:
        model = self.require("embed")
        if dimensions is not None:  # refuse before spending compute
            postprocess.truncate_dimensions(np.zeros((1, 1)), dimensions, model.hidden_size)
        texts_or_ids = list(inputs)
        if texts_or_ids and not isinstance(texts_or_ids[0], str):
            job = lambda: self.tokenizer.from_ids(texts_or_ids, truncate=truncate)  # noqa: E731
        else:
            texts_or_ids = self.with_prompt(texts_or_ids, prompt_name)  # type: ignore[arg-type]
            job = lambda: self.tokenizer.encode(  # noqa: E731
                texts_or_ids, truncate=truncate, direction=truncation_direction
            )
        result = await self._run(job, sum(map(len, texts_or_ids)))
        result.outputs = postprocess.embedding_output(
            result.outputs,
            normalize=model.normalize if normalize is None else normalize,
            dimensions=dimensions,
            hidden=model.hidden_size,
        )
        return result

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        raw_scores: bool = False,
        truncate: bool = True,
    ) -> Result:
        self.require("rerank")
        pairs = [(query, doc) for doc in documents]
        result = await self._run(
            lambda: self.tokenizer.encode_pairs(pairs, truncate=truncate),
            len(query) * len(pairs) + sum(map(len, documents)),
        )
        result.outputs = postprocess.rerank_scores(result.outputs, raw=raw_scores)
        return result

    async def classify(
        self, texts: Sequence[str], *, raw_scores: bool = False, truncate: bool = True
    ) -> tuple[list[list[dict]], Result]:
        model = self.require("classify")
        result = await self._run(
            lambda: self.tokenizer.encode(list(texts), truncate=truncate), sum(map(len, texts))
        )
        return postprocess.label_scores(result.outputs, model.id2label, raw=raw_scores), result

    async def tokenize(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list:
        if self.tokenizer is None:
            raise NotReady(f"model {self.name!r} is still loading")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._tokenize_pool,
            lambda: [
                self.tokenizer.tokenize_detail(t, add_special_tokens=add_special_tokens)
                for t in texts
            ],
        )

    def with_prompt(self, texts: list[str], prompt_name: str | None) -> list[str]:
        assert self.model is not None
        name = prompt_name or self.model.default_prompt_name
        if name is None:
            return texts
        if name not in self.model.prompts:
            raise BadRequest(
                f"prompt_name {name!r} is not one of this model's prompts "
                f"{sorted(self.model.prompts) or '(none)'}",
                param="prompt_name",
            )
        prefix = self.model.prompts[name]
        return [prefix + t for t in texts]

    async def _run(self, tokenize: Callable[[], list[Tokens]], size: int) -> Result:
        """Tokenize (inline when ``size`` is small, else on a thread), queue, await rows."""
        assert self.batcher is not None and self.model is not None
        t0 = time.perf_counter()
        if size <= INLINE_TOKENIZE_CHARS:
            tokens = tokenize()
        else:
            loop = asyncio.get_running_loop()
            tokens = await loop.run_in_executor(self._tokenize_pool, tokenize)
        timings = Timings(tokenize=time.perf_counter() - t0)
        futures = self.batcher.submit(tokens)
        try:
            rows = await asyncio.wait_for(asyncio.gather(*futures), self.spec.request_timeout)
        except asyncio.TimeoutError:
            raise RequestTimeout(
                f"request waited more than {self.spec.request_timeout:g}s for model "
                f"{self.name!r}; the server is saturated"
            ) from None
        finally:
            for fut in futures:  # on cancel/timeout: drop what has not run yet
                fut.cancel()
        timings.queue = max(r.queue_s for r in rows)
        timings.forward = max(r.forward_s for r in rows)
        name = self.model.served_name
        self.metrics.stage_seconds.labels(name, "tokenize").observe(timings.tokenize)
        self.metrics.stage_seconds.labels(name, "queue").observe(timings.queue)
        self.metrics.stage_seconds.labels(name, "forward").observe(timings.forward)
        return Result(
            outputs=np.stack([r.row for r in rows]),
            prompt_tokens=sum(len(t) for t in tokens),
            timings=timings,
        )


def _route_hint(task: Task) -> str:
    return {"embed": "v1/embeddings", "rerank": "v1/rerank", "classify": "classify"}[task]


class EngineArray:
    """All served models; routes a request's ``model`` field to its engine."""

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        *,
        metrics: Metrics | None = None,
        backend_loader: Callable[[ResolvedModel], Backend] = load_backend,
    ) -> None:
        self.metrics = metrics or Metrics()
        self.engines = [
            Engine(spec, metrics=self.metrics, backend_loader=backend_loader) for spec in specs
        ]
        self.started = False

    @classmethod
    def from_settings(cls, settings: object) -> EngineArray:
        return cls(settings.model_specs())  # type: ignore[attr-defined]

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

    def get(self, name: str | None) -> Engine:
        """One model: any name is accepted (as Infinity and TEI do). Several: exact match."""
        if len(self.engines) == 1:
            return self.engines[0]
        for engine in self.engines:
            if engine.name == name:
                return engine
        served = ", ".join(self.names)
        if not name:
            raise BadRequest(
                f"several models are served; set `model` to one of: {served}", param="model"
            )
        raise NotFound(f"model {name!r} is not served here; served models: {served}", param="model")

    def for_task(self, name: str | None, task: Task) -> Engine:
        """Like get(), but with no name and several models, pick the one doing ``task``."""
        if not name and len(self.engines) > 1:
            doing = [e for e in self.engines if e.model is not None and e.model.task == task]
            if len(doing) == 1:
                return doing[0]
        return self.get(name)

    def __getitem__(self, name: str) -> Engine:
        return self.get(name)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.engines)
