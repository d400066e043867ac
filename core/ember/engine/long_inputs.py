"""Long documents on one model: each input cut into chunks (``ember.processors.chunks``),
embedded, and aggregated into a document vector (``ember.chunking``).

Plain chunking embeds each chunk's text as its own input (its prompt and special tokens
added as for any text), so a chunk's vector is the one its text alone gets, and the chunks of
every document batch with each other and with other requests' inputs. Late chunking runs
one forward over the whole document (overlapping windows past the model's length) and pools
each chunk from its own tokens' vectors: the head gives each window's partial pools per
chunk (``DenseHead.split`` with ``Tokens.spans``), combined here exactly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ember.batch import Tokens
from ember.chunking import LATE_POOLINGS, Chunking, Span
from ember.engine.prepare import Preparer
from ember.engine.requests import EmbedRequest
from ember.engine.result import Result
from ember.engine.text_inputs import TextInputs
from ember.errors import BadRequest
from ember.heads.base import Head
from ember.heads.dense import DenseHead
from ember.models.spec import ResolvedModel
from ember.outputs import ChunkedVectors, DenseVectors, is_dense, l2_normalize
from ember.processors.chunks import Tokenised, given_spans, plan, spans_of_chars, windows
from ember.processors.text import TextTokenizer

# (prepare, output, count, sizes, ids) -> (rows, result): ``Engine._run``.
Run = Callable[..., Awaitable[tuple[list[Any], Result]]]


@dataclass(frozen=True, slots=True)
class LongInputs:
    """One loaded model's long-document embedding."""

    model: ResolvedModel
    processor: Any  # the model's processor; chunking takes a plain ``TextTokenizer``
    text_inputs: TextInputs
    heads: dict[str, Head]
    prepare: Preparer
    run: Run

    def check(self, request: EmbedRequest, chunking: Chunking) -> TextTokenizer:
        """What a model or a request cannot chunk, refused in one line before any work."""
        family, name = self.model.family, self.model.served_name
        if request.modality != "text":
            raise BadRequest(
                f"chunking is for text; {request.modality} inputs have no chunks",
                param="chunking",
            )
        if not is_dense(request.output):
            raise BadRequest(
                f"chunking gives one dense vector per chunk; model {name!r} ({family.name}) "
                f"returns {request.output} embeddings, which chunk with no clear meaning: "
                "send its inputs whole",
                param="chunking",
            )
        processor = self.processor
        if type(processor) is not TextTokenizer:  # ColBERT, a Router: their own inputs
            raise BadRequest(
                f"chunking is for text models with one tokenizer; model {name!r} "
                f"({family.name}) encodes its inputs its own way",
                param="chunking",
            )
        if request.inputs and not isinstance(request.inputs[0], str):
            raise BadRequest("chunking takes text, not token ids", param="input")
        if request.max_tokens is not None:
            raise BadRequest(
                "truncate_prompt_tokens cuts inputs and chunking keeps all of them: send one",
                param="truncate_prompt_tokens",
            )
        if chunking.late:
            head = self.heads.get("dense")
            pooling = head.mode if isinstance(head, DenseHead) else None
            if pooling not in LATE_POOLINGS:
                raise BadRequest(
                    f"late chunking pools each chunk's token vectors; model {name!r} pools "
                    f"by {pooling or 'its own network'} (late chunking takes "
                    f"{', '.join(LATE_POOLINGS)}): send chunking without late_chunking",
                    param="late_chunking",
                )
        return processor

    def _prompt(self, request: EmbedRequest) -> str:
        """The prompt in front of each text (checked: an unknown name is refused)."""
        return self.text_inputs.with_prompt([""], request.prompt_name)[0]

    async def embed(self, request: EmbedRequest, normalize: bool) -> Result:
        """``request``'s inputs chunked, embedded and aggregated (validated already)."""
        chunking = request.chunking
        assert chunking is not None
        processor = self.check(request, chunking)
        texts = list(request.inputs)
        prompt = self._prompt(request)
        if chunking.given:
            joined, chars = given_spans(texts)
            docs = await self.prepare.on_pool(lambda: processor.tokenised([joined, prompt]))
            prompt_ids = list(docs[1].ids) if prompt else []
            spans = [spans_of_chars(docs[0], chars)]
            docs = docs[:1]
        else:
            docs = await self.prepare.on_pool(lambda: processor.tokenised([*texts, prompt]))
            prompt_ids = list(docs[-1].ids) if prompt else []
            docs = docs[:-1]
            room = processor.max_length - processor.specials - len(prompt_ids)
            size = chunking.within(room)
            spans = [plan(doc, size, chunking.overlap, chunking.boundary) for doc in docs]
        if chunking.late:
            vectors, result = await self._late(request, processor, docs, spans, prompt_ids)
        else:
            vectors, result = await self._plain(request, docs, spans)
        chunks = DenseVectors(vectors).finished(
            normalize=normalize, dimensions=request.dimensions, hidden=self.model.hidden_size
        )
        if chunking.given:  # Jina's shape: one vector per string, each a chunk
            result.output = chunks
            return result
        counts = [len(s) for s in spans]
        per_doc = np.split(chunks.vectors, np.cumsum(counts)[:-1])
        documents = None
        if chunking.aggregate != "none":
            documents = np.stack(
                [
                    aggregate(v, s, chunking.aggregate, normalize)
                    for v, s in zip(per_doc, spans, strict=True)
                ]
            )
        texts_out = None
        if chunking.text:
            texts_out = [
                [doc.text[s.char_start : s.char_end] for s in doc_spans]
                for doc, doc_spans in zip(docs, spans, strict=True)
            ]
        result.output = ChunkedVectors(documents, per_doc, spans, texts_out)
        return result

    async def _plain(
        self, request: EmbedRequest, docs: list[Tokenised], spans: list[list[Span]]
    ) -> tuple[np.ndarray, Result]:
        """Each chunk's text embedded as an input of its own."""
        texts = [
            doc.text[s.char_start : s.char_end]
            for doc, ss in zip(docs, spans, strict=True)
            for s in ss
        ]
        job = self.text_inputs.job(
            texts,
            truncate=True,
            direction="right",
            prompt_name=request.prompt_name,
            query=request.query,
            max_tokens=None,
        )
        sizes = [len(t) for t in texts]
        rows, result = await self.run(
            self.prepare.tokenizing(job, sum(sizes)), "dense", len(texts), sizes
        )
        return np.stack(rows), result

    async def _late(
        self,
        request: EmbedRequest,
        processor: TextTokenizer,
        docs: list[Tokenised],
        spans: list[list[Span]],
        prompt_ids: list[int],
    ) -> tuple[np.ndarray, Result]:
        """One forward per window of each document, each chunk pooled from the windows that
        own its tokens."""
        room = processor.max_length - processor.specials - len(prompt_ids)
        if room < 1:
            raise BadRequest("the model's prompt leaves no room for the document", param="chunking")
        lead = processor.leading_specials + len(prompt_ids)
        named = request.prompt_name or self.model.default_prompt_name or ""
        adapter = self.model.task_adapters.get(named)
        pieces: list[Tokens] = []
        owners: list[list[int]] = []  # per piece, the flat chunk index of each of its spans
        first = 0  # the flat index of each document's first chunk
        for doc, doc_spans in zip(docs, spans, strict=True):
            if len(doc) == 0:  # no tokens (whitespace): pooled over its special tokens
                piece = processor.wrapped(prompt_ids)
                pieces.append(replace(piece, spans=((0, len(piece)),), adapter=adapter))
                owners.append([first])
                first += len(doc_spans)
                continue
            for window in windows(len(doc), room):
                own, parts = [], []
                for k, span in enumerate(doc_spans):
                    a = max(span.token_start, window.own_start)
                    b = min(span.token_end, window.own_end)
                    if a < b:
                        own.append(first + k)
                        parts.append((a - window.start + lead, b - window.start + lead))
                if not own:  # tokens no chunk covers: nothing to pool from this window
                    continue
                ids = prompt_ids + list(doc.ids[window.start : window.end])
                pieces.append(replace(processor.wrapped(ids), spans=tuple(parts), adapter=adapter))
                owners.append(own)
            first += len(doc_spans)

        async def prepare() -> list[Tokens]:
            return pieces

        rows, result = await self.run(
            prepare, "dense", len(pieces), [len(p) for p in pieces], ids=True
        )
        head = self.heads["dense"]
        assert isinstance(head, DenseHead)
        width = rows[0].shape[1] if rows else 0
        parts_sum = np.zeros((first, width), dtype=np.float32)
        if head.mode == "max":
            parts_sum.fill(-np.inf)
        counts = np.zeros(first, dtype=np.int64)
        for row, own, piece in zip(rows, owners, pieces, strict=True):
            assert piece.spans is not None
            for k, (a, b), part in zip(own, piece.spans, row, strict=True):
                if head.mode == "max":
                    parts_sum[k] = np.maximum(parts_sum[k], part)
                else:
                    parts_sum[k] += part
                counts[k] += b - a
        parts_sum[~np.isfinite(parts_sum)] = 0.0  # a chunk of no tokens (an empty string)
        return head.chunk_vectors(parts_sum, counts), result


def aggregate(vectors: np.ndarray, spans: Sequence[Span], how: str, normalize: bool) -> np.ndarray:
    """A document's vector from its chunks' ``vectors``: their mean weighted by each chunk's
    tokens (``mean``), their element-wise maximum (``max``) or the first chunk's
    (``first``), then the model's own normalisation."""
    if how == "first":
        return vectors[0]
    if how == "max":
        out = vectors.max(axis=0)
    else:
        weights = np.array([max(s.tokens, 1) for s in spans], dtype=np.float64)
        out = (vectors.astype(np.float64) * weights[:, None]).sum(axis=0) / weights.sum()
    out = out.astype(np.float32)
    return l2_normalize(out) if normalize else out
