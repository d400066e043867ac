"""Engine: one served model's async API, as data flows through it.

request items -> processor (features + cost) -> batcher (by cost) -> on a forward thread:
collate -> backend.forward (named outputs) -> heads (one result per item) -> back here,
where the rows become the request's typed output, which finishes itself (``ember.outputs``:
normalise, Matryoshka, activation, MaxSim).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import Any

from ember.backends import load_backend
from ember.backends.base import Backend
from ember.callers import charge
from ember.capabilities import Modality, Output
from ember.cpu import lower_thread_priority
from ember.engine.admission import TextCost
from ember.engine.batcher import (
    Batcher,
    bulk_tokens_for,
    padding_budget_for,
    representative_tokens_for,
)
from ember.engine.cache import EmbeddingCache, embed_through
from ember.engine.forward import Piece, at_priority, run_batch
from ember.engine.loading import Loaded, close_unused, load_parts
from ember.engine.long_inputs import LongInputs
from ember.engine.long_rerank import LongRerank, Pair
from ember.engine.prepare import Prepare, Preparer
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest
from ember.engine.result import Result, Timings
from ember.engine.shares import LanePolicy
from ember.engine.start_failure import start_failure
from ember.engine.text_inputs import TextInputs
from ember.engine.warm_up import warm_up
from ember.errors import BadRequest, EmberError, NotReady, RequestTimeout
from ember.families.base import Family
from ember.heads.base import Head
from ember.lanes import current as current_lane
from ember.media.budget import MediaBudget
from ember.metrics import Metrics
from ember.models.score_activation import served_activation
from ember.models.spec import ModelSpec, ResolvedModel
from ember.outputs import Logits, MultiVectors, output_type
from ember.processors import TextProcessor

log = logging.getLogger(__name__)


def _served(inputs: int, result: Result) -> Result:
    """``result``, its inputs and tokens reported to the request's API key (its usage and
    its inputs/tokens rate limits): what a request served, counted once per engine call."""
    charge(inputs, result.prompt_tokens)
    return result


def _retrieved(future: asyncio.Future) -> None:
    """Read a finished future's outcome, so that asyncio never logs it as unread."""
    if not future.cancelled():
        future.exception()


class Engine:
    def __init__(
        self,
        spec: ModelSpec,
        *,
        metrics: Metrics | None = None,
        backend_loader: Callable[[ResolvedModel], Backend] = load_backend,
        media_budget: MediaBudget | None = None,
        cache: EmbeddingCache | None = None,
    ) -> None:
        """``cache``: the embedding cache (``ember.engine.cache``) this engine's ``embed``
        answers through; None: every input is computed."""
        self.spec = spec
        self.metrics = metrics or Metrics()
        self._backend_loader = backend_loader
        self.cache = cache
        self._identity: str | None = None  # the cache keys' model part, set at start
        self.model: ResolvedModel | None = None
        self.backend: Backend | None = None
        self.processor: TextProcessor | None = None
        self.heads: dict[Output, Head] = {}
        self.batcher: Batcher | None = None
        self._prepare = Preparer(media_budget)
        self.text_inputs: TextInputs | None = None  # set at start
        self.long_inputs: LongInputs | None = None  # set at start
        self.long_rerank: LongRerank | None = None  # set at start
        self.text_cost = TextCost()  # characters per token, for admission by cost
        self.ready = False
        self.load_seconds = 0.0
        self.load_began: float | None = None  # perf_counter: when this engine's load began
        self._loading: Future[Loaded] | None = None  # the load begun, not yet taken over
        self.warmup_seconds = 0.0

    # ---- lifecycle -------------------------------------------------------------------------
    def begin_load(self) -> None:
        """Begin resolving and loading the model now, on a thread at the forward priority;
        ``start`` takes the load over. Needs no event loop: ``ember serve`` begins its first
        model's load before it imports and builds the HTTP app, which the load overlaps
        (ONNX Runtime's session is built outside the GIL)."""
        if self._loading is None and not self.ready:
            self.load_began = time.perf_counter()
            work = partial(load_parts, self.spec, self._backend_loader, self.cache is not None)
            name = f"load-{self.name}"
            self._loading = at_priority(work, self.spec.forward_nice, name)

    async def start(self) -> None:
        """Load (or take over the load ``begin_load`` began) and warm up; returns when the
        model can serve.

        A failure that is not already a refusal in words (an exporter's, a network's or a
        library's own exception) ends the start as one line naming the model, its family
        and backend and what to use instead (``start_failure``); the traceback is logged
        at debug level."""
        if self.ready:
            return
        self.begin_load()
        loading = self._loading
        assert loading is not None
        try:
            loaded = await asyncio.wrap_future(loading)
        except asyncio.CancelledError:
            raise  # still ``_loading``: ``stop`` closes what the load goes on to build
        except BaseException:
            self._loading = None
            raise
        self._loading = None
        model, backend = loaded.model, loaded.backend
        self.model, self.backend, self.processor = model, backend, loaded.processor
        self.heads, self._identity = loaded.heads, loaded.identity
        try:
            await self._start(model, backend, loaded.seconds)
        except EmberError:
            raise
        except Exception as exc:
            log.debug("starting model %s failed", model.served_name, exc_info=True)
            raise start_failure(model, backend.info.name, exc) from exc

    async def _start(self, model: ResolvedModel, backend: Backend, load_seconds: float) -> None:
        started = time.perf_counter()
        assert self.processor is not None
        self.text_inputs = TextInputs(
            model, self.processor, accept_token_ids=self.spec.accept_token_ids
        )
        static_batch = backend.max_batch_size
        max_batch_size = min(self.spec.max_batch_size, static_batch or self.spec.max_batch_size)
        self.batcher = Batcher(
            partial(run_batch, self.processor, backend, self.heads),
            name=model.served_name,
            max_batch_tokens=self.spec.max_batch_tokens,
            max_batch_size=max_batch_size,
            max_queue_size=self.spec.max_queue_size,
            metrics=self.metrics,
            workers=backend.parallel_forwards,
            thread_setup=partial(lower_thread_priority, self.spec.forward_nice),
            padding=backend.padding or padding_budget_for(backend.info.device),
            representative_tokens=representative_tokens_for(
                backend.info.device, self.spec.max_batch_tokens
            ),
            lanes=LanePolicy(
                self.spec.lane_weights,
                self.spec.bulk_batch_tokens
                or bulk_tokens_for(backend.info.device, self.spec.max_batch_tokens),
            ),
        )
        self.batcher.start()
        self.long_inputs = LongInputs(
            model, self.processor, self.text_inputs, self.heads, self._prepare, self._run
        )
        self.long_rerank = LongRerank(
            model,
            self.processor,
            self._prepare,
            self._pair_encoder,
            self._scored,
            self.metrics.truncated_inputs.labels(model.served_name).inc,
        )
        self.load_seconds = load_seconds + time.perf_counter() - started
        self.warmup_seconds = await warm_up(self)
        self.ready = True
        log.info(
            "model %s ready: family=%s backend=%s device=%s dtype=%s forwards=%d "
            "load=%.2fs warm-up=%.2fs",
            model.served_name,
            self.family.name,
            backend.info.name,
            backend.info.device,
            backend.info.dtype,
            self.batcher.workers,
            self.load_seconds,
            self.warmup_seconds,
        )

    async def stop(self) -> None:
        self.ready = False
        if self._loading is not None:  # a load begun and never taken over: closed when done
            self._loading.add_done_callback(close_unused)
            self._loading = None
        if self.batcher:
            await self.batcher.stop()
        if self.backend:
            self.backend.close()
        self._prepare.close()

    # ---- facts -----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.model.served_name if self.model else (self.spec.served_model_name or "")

    @property
    def family(self) -> Family:
        assert self.model is not None, "engine not started"
        return self.model.family

    def _loaded(self) -> ResolvedModel:
        if self.batcher is None or self.model is None:
            raise NotReady(f"model {self.name!r} is still loading")
        return self.model

    # ---- the calls -------------------------------------------------------------------------
    async def embed(self, request: EmbedRequest) -> Result:
        """The embeddings ``request`` asks for, validated once against the model; with the
        embedding cache on, inputs embedded before with the same options come from it and
        skip the batcher."""
        model = self._loaded()
        request = request.validated(model, self.name)
        inputs = request.inputs
        if request.chunking is not None:  # long documents: chunks are never cached
            assert self.long_inputs is not None
            if self.spec.embedding_dtype != "float32":
                raise BadRequest(
                    f"chunked answers are float32; model {self.name!r} answers "
                    f"{self.spec.embedding_dtype} vectors (--embedding-dtype)",
                    param="chunking",
                )
            normalize = model.normalize if request.normalize is None else request.normalize
            return _served(len(inputs), await self.long_inputs.embed(request, normalize))
        if self.cache is None or self._identity is None:
            return _served(len(inputs), await self._embed(request))
        result = await embed_through(
            self.cache,
            self.name,
            self._identity,
            list(inputs),
            request.options(),
            lambda items: self._embed(replace(request, inputs=items)),
        )
        return _served(len(inputs), result)

    async def embed_uncounted(self, request: EmbedRequest) -> Result:
        """``request`` computed, neither cached nor charged to a caller (the warm-up's)."""
        return await self._embed(request.validated(self._loaded(), self.name))

    async def _embed(self, request: EmbedRequest) -> Result:
        """``embed`` of a validated request, computing every input."""
        model = self._loaded()
        assert request.output is not None  # validated
        items = list(request.inputs)
        prepare: Prepare
        sizes: list[int] | None = None  # characters, or token ids, of each text input
        ids = False
        if request.modality != "text":
            prepare = self._media(items, request.modality)
        else:
            assert self.text_inputs is not None
            job = self.text_inputs.job(
                items,
                truncate=request.truncate,
                direction=request.truncation_direction,
                prompt_name=request.prompt_name,
                query=request.query,
                max_tokens=request.max_tokens,
            )
            sizes = [len(it) for it in items]
            prepare = self._prepare.tokenizing(job, sum(sizes))
            ids = bool(items) and not isinstance(items[0], str)
        rows, result = await self._run(prepare, request.output, len(items), sizes, ids=ids)
        normalize = model.normalize if request.normalize is None else request.normalize
        result.output = (
            output_type(request.output)
            .from_rows(rows)
            .finished(normalize=normalize, dimensions=request.dimensions, hidden=model.hidden_size)
        )
        return result

    async def rerank(self, request: RerankRequest) -> Result:
        """One score per document: a cross-encoder's or an LLM reranker's (its activation
        unless raw), or MaxSim's; with ``max_tokens_per_doc`` or ``max_chunks_per_doc``, its
        best chunk's (``ember.engine.long_rerank``)."""
        self._loaded()
        processor = self.processor
        assert processor is not None
        query, modality, truncate = request.query, request.modality, request.truncate
        scoring = self.family.require_scoring(self.name)
        if request.instruction is not None:
            self.family.require_instruction(self.name)
        if request.chunked:
            assert self.long_rerank is not None
            result = await self.long_rerank.rerank(request, scoring)
            return _served(len(request.documents), result)
        if scoring == "maxsim":
            docs = list(request.documents)
            if modality != "text":
                self.family.require_modality(modality, self.name)
                pages = self._media(docs, modality)

                async def prepare() -> list:
                    return processor.encode([query], truncate=truncate, query=True) + (
                        await pages()
                    )

            sizes: list[int] | None = None
            if modality == "text":
                sizes = [len(query), *map(len, docs)]
                prepare = self._prepare.tokenizing(
                    lambda: (
                        processor.encode([query], truncate=truncate, query=True)
                        + processor.encode(docs, truncate=truncate)
                    ),
                    sum(sizes),
                )
            rows, result = await self._run(prepare, MultiVectors.kind, 1 + len(docs), sizes)
            result.output = MultiVectors.from_rows(rows).maxsim()
            return _served(len(docs), result)
        if modality != "text":
            self.family.require_modality(modality, self.name)
        pairs = [(query, doc) for doc in request.documents]
        return _served(len(pairs), await self._scored(request, pairs))

    def _pair_encoder(self, request: RerankRequest, pairs: list[Pair]) -> Callable[[], list]:
        """Tokenising ``pairs`` as ``request`` asks: its truncation, and its instruction
        (an instructed family's processor takes it)."""
        assert self.processor is not None
        encode = partial(self.processor.encode_pairs, pairs, truncate=request.truncate)
        if request.instruction is not None:
            encode = partial(encode, instruction=request.instruction)
        return encode

    async def _scored(self, request: RerankRequest, pairs: list[Pair]) -> Result:
        """``pairs`` scored by a cross-encoder or an LLM reranker: its activation unless raw."""
        model = self._loaded()
        pair_sizes = [len(query) + len(doc) for query, doc in pairs]
        rows, result = await self._run(
            self._prepare.tokenizing(self._pair_encoder(request, pairs), sum(pair_sizes)),
            Logits.kind,
            len(pairs),
            pair_sizes,
        )
        activation = served_activation(model.rerank_activation, self.family.backbone, request.scale)
        raw = request.raw_scores or activation == "none"
        result.output = Logits.from_rows(rows).scores(raw=raw)
        return result

    async def classify(self, request: ClassifyRequest) -> tuple[list[list[dict]], Result]:
        """Every label's score per text, best first (``result.output``: the ``Labels``)."""
        model = self._loaded()
        self.family.require_classify(self.name)
        processor = self.processor
        assert processor is not None
        texts, truncate = list(request.texts), request.truncate
        sizes = [len(t) for t in texts]
        encode = partial(processor.encode, texts, truncate=truncate)
        rows, result = await self._run(
            self._prepare.tokenizing(encode, sum(sizes)),
            Logits.kind,
            len(texts),
            sizes,
        )
        labels = Logits.from_rows(rows).labels(
            model.id2label, raw=request.raw_scores, activation=model.activation
        )
        result.output = labels
        return labels.rows, _served(len(texts), result)

    async def tokenize(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list:
        processor = self.processor
        if processor is None:
            raise NotReady(f"model {self.name!r} is still loading")
        return await self._prepare.on_pool(
            lambda: [
                processor.tokenize_detail(t, add_special_tokens=add_special_tokens) for t in texts
            ]
        )

    def _media(self, items: list, modality: Modality) -> Prepare:
        processor = self.processor
        assert processor is not None
        limits = processor.limits  # type: ignore[attr-defined]  # a MediaProcessor's
        return self._prepare.media(items, modality, processor, limits, self.spec.request_timeout)

    def _costs(self, sizes: Sequence[int] | None, ids: bool) -> list[float] | None:
        """Each input's cost (tokens) as known at arrival: its token ids' count, or its
        characters at the measured characters per token; None when unknown (media)."""
        if sizes is None or self.processor is None:
            return None
        cap = self.processor.max_length
        if ids:
            return [float(min(size, cap)) for size in sizes]
        return self.text_cost.estimate(sizes, cap)

    async def _run(
        self,
        prepare: Prepare,
        output: Output,
        count: int,
        sizes: Sequence[int] | None = None,
        *,
        ids: bool = False,
    ) -> tuple[list[Any], Result]:
        """Admit ``count`` inputs, prepare their features (tokenise; fetch and decode media),
        queue, await rows. The deadline runs from here, the request's arrival, and a full
        queue, or inputs that alone could not be answered in time, refuse before any
        tokenisation or download. ``sizes``: each text input's characters (``ids``: its
        token ids' count), for that estimate."""
        assert self.batcher is not None and self.model is not None
        t0 = time.perf_counter()
        deadline = t0 + self.spec.request_timeout
        self.batcher.admit(count, self.spec.request_timeout, self._costs(sizes, ids))
        submitted = False
        futures: list[asyncio.Future] = []
        try:
            tokens = await prepare()  # inline tokenising awaits nothing: no task, no switch
            timings = Timings(tokenize=time.perf_counter() - t0, started=t0)
            if time.perf_counter() >= deadline:
                raise asyncio.TimeoutError
            pieces = [Piece(t, output) for t in tokens]
            futures = self.batcher.submit(
                pieces, reserved=count, deadline=deadline, lane=current_lane()
            )
            submitted = True
            remaining = max(0.0, deadline - time.perf_counter())
            gathered = asyncio.gather(*futures)
            # Cancelled under wait_for (3.11), the gather ends holding a CancelledError that
            # nothing reads: asyncio would log "exception was never retrieved" per request.
            gathered.add_done_callback(_retrieved)
            rows = await asyncio.wait_for(gathered, remaining)
        except BaseException as exc:
            if not submitted:
                self.batcher.release(count)
            else:  # cancelled, timed out, failed: what of it is left stops counting now
                self.batcher.drop(futures)
            if isinstance(exc, asyncio.TimeoutError):
                raise RequestTimeout(
                    f"request waited more than {self.spec.request_timeout:g}s for model "
                    f"{self.name!r}; the server is saturated"
                ) from None
            raise
        counts = [len(t) for t in tokens]
        timings.truncated = sum(1 for t in tokens if getattr(t, "truncated_from", None))
        if timings.truncated:
            self.metrics.truncated_inputs.labels(self.model.served_name).inc(timings.truncated)
        if sizes is not None and not ids and self.processor is not None:
            self.text_cost.observe(sizes, counts, self.processor.max_length)
        timings.queue = max(r.queue_s for r in rows)
        timings.forward = max(r.forward_s for r in rows)
        widest = max(rows, key=lambda r: r.batch_size)
        timings.batch_size, timings.batch_tokens = widest.batch_size, widest.batch_tokens
        name = timings.model = self.model.served_name
        self.metrics.stage_seconds.labels(name, "tokenize").observe(timings.tokenize)
        self.metrics.stage_seconds.labels(name, "queue").observe(timings.queue)
        self.metrics.stage_seconds.labels(name, "forward").observe(timings.forward)
        timings.tokens = sum(counts)
        result = Result(None, prompt_tokens=sum(counts), timings=timings, input_tokens=counts)
        return [r.row for r in rows], result
