"""Long documents in reranking (Cohere's ``max_tokens_per_doc`` and ``max_chunks_per_doc``):
each document cut into chunks of its own tokens (``ember.processors.chunks``: between words,
with exact character offsets), every (query, chunk) pair scored as a pair of its own in the
batches every other pair runs in, and the document's score its best chunk's (Cohere's
maximum over a document's chunks).

A chunk's pair is the query with the chunk's text, cut from the document by its offsets, so
a chunk scores what its text scores reranked alone. A chunk holds at most what fits beside
the query: the model's length less the pair of the query and an empty document (special
tokens, an LLM reranker's prompt). A document no longer than one chunk is scored as sent.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ember.batch import Tokens
from ember.capabilities import Scoring
from ember.chunking import Span
from ember.engine.prepare import Preparer
from ember.engine.requests import RerankRequest
from ember.engine.result import Result
from ember.errors import BadRequest
from ember.models.spec import ResolvedModel
from ember.outputs import ChunkedScores, Scores
from ember.processors.chunks import Tokenised, plan
from ember.processors.text import TextTokenizer

Pair = tuple[str, str]
# ``Engine._pair_encoder``: the tokenising of pairs a request asks for (its instruction).
Encode = Callable[[RerankRequest, list[Pair]], Callable[[], list[Tokens]]]
# ``Engine._scored``: pairs scored as the request asks, ``result.output`` their ``Scores``.
Score = Callable[[RerankRequest, list[Pair]], Awaitable[Result]]


@dataclass(frozen=True, slots=True)
class Chunked:
    """A request's documents as (query, chunk) pairs, in order: per document its chunks'
    spans, and the documents that had more chunks than ``max_chunks_per_doc`` (the rest cut)."""

    pairs: list[Pair]
    spans: list[list[Span]]
    cut: list[int]


def chunk_pairs(query: str, docs: Sequence[Tokenised], size: int, limit: int | None) -> Chunked:
    """Each document's chunks of at most ``size`` tokens, the first ``limit`` of them; a
    document of at most ``size`` tokens is one chunk, its text as sent."""
    pairs: list[Pair] = []
    spans: list[list[Span]] = []
    cut: list[int] = []
    for i, doc in enumerate(docs):
        if len(doc) <= size:
            doc_spans = [Span(0, len(doc), 0, len(doc.text))]
            pairs.append((query, doc.text))
        else:
            doc_spans = plan(doc, size)
            if limit is not None and len(doc_spans) > limit:
                doc_spans = doc_spans[:limit]
                cut.append(i)
            pairs.extend((query, doc.text[s.char_start : s.char_end]) for s in doc_spans)
        spans.append(doc_spans)
    return Chunked(pairs, spans, cut)


def best_chunks(values: np.ndarray, spans: Sequence[Sequence[Span]]) -> ChunkedScores:
    """Per document, its best chunk's score (the first on a tie) and where that chunk lies;
    ``values`` holds every chunk's score, the documents' in order."""
    counts = [len(s) for s in spans]
    parts = np.split(np.asarray(values, dtype=np.float64), np.cumsum(counts)[:-1])
    best = [int(np.argmax(p)) for p in parts]
    scores = np.array([p[b] for p, b in zip(parts, best, strict=True)], dtype=np.float64)
    return ChunkedScores(scores, best, [s[b] for s, b in zip(spans, best, strict=True)])


def option(request: RerankRequest) -> str:
    """The option the request sent, for its errors."""
    return "max_tokens_per_doc" if request.max_tokens_per_doc is not None else "max_chunks_per_doc"


def refusal(
    model: ResolvedModel, request: RerankRequest, scoring: Scoring, processor: Any
) -> BadRequest | None:
    """Why this model or request cannot score documents by their chunks (None: it can).

    MaxSim scores a document by every query token's best match among all the document's
    tokens: the best chunk's MaxSim is not the document's (a query token's best match may
    lie in another chunk), so a MaxSim model refuses rather than answer a different score;
    page images have no tokens to cut."""
    param, family, name = option(request), model.family, model.served_name
    if request.modality != "text":
        return BadRequest(
            f"{param} cuts text documents into chunks; {request.modality} documents have "
            "none: send them without it",
            param=param,
        )
    if scoring == "maxsim":
        return BadRequest(
            f"{param} scores a document by its best chunk; model {name!r} ({family.name}) "
            "scores by MaxSim over all of a document's tokens, which chunks would change: "
            "send documents without it",
            param=param,
        )
    if not isinstance(processor, TextTokenizer):
        return BadRequest(
            f"{param} cuts documents with the model's tokenizer; model {name!r} "
            f"({family.name}) encodes its inputs its own way",
            param=param,
        )
    return None


@dataclass(frozen=True, slots=True)
class LongRerank:
    """One loaded model's long-document reranking. ``truncated`` counts documents cut to
    ``max_chunks_per_doc`` (the ``ember_truncated_inputs`` metric)."""

    model: ResolvedModel
    processor: Any  # the model's processor; chunking takes a ``TextTokenizer``
    prepare: Preparer
    encode: Encode
    score: Score
    truncated: Callable[[int], None]

    async def rerank(self, request: RerankRequest, scoring: Scoring) -> Result:
        """One score per document, its best chunk's, and where that chunk lies."""
        refused = refusal(self.model, request, scoring, self.processor)
        if refused is not None:
            raise refused
        processor: TextTokenizer = self.processor
        probe = replace(request, truncate=True)

        def tokenise() -> tuple[int, int, list[Tokenised]]:
            beside, most = self._measure(probe, processor)
            return beside, most, processor.tokenised(list(request.documents))

        beside, most, docs = await self.prepare.on_pool(tokenise)
        room = most - beside
        if room < 1:
            raise BadRequest(
                f"the query takes {beside} of this model's {most} tokens with its special "
                "tokens, leaving none for a document's chunks: shorten it",
                param="query",
            )
        size = min(request.max_tokens_per_doc or room, room)
        limit = request.max_chunks_per_doc
        chunked = chunk_pairs(request.query, docs, size, limit)
        if chunked.cut and not request.truncate:
            raise BadRequest(
                f"document {chunked.cut[0]} has more than max_chunks_per_doc ({limit}) chunks "
                f"of {size} tokens; send truncate=true to score its first {limit}, or raise "
                "max_chunks_per_doc",
                param="max_chunks_per_doc",
            )
        result = await self.score(request, chunked.pairs)
        assert isinstance(result.output, Scores)
        result.output = best_chunks(result.output.values, chunked.spans)
        if chunked.cut:
            result.timings.truncated += len(chunked.cut)
            self.truncated(len(chunked.cut))
        return result

    def _measure(self, request: RerankRequest, processor: TextTokenizer) -> tuple[int, int]:
        """The tokens the query's pair takes with an empty document, and the most a pair
        keeps (its document longer than the model takes): a chunk gets the difference.
        Measured, not derived from the model's length: an LLM reranker's prompt cuts the
        document at its own budget (bge-reranker-v2-gemma's keeps less than its length less
        the query)."""
        filler = " ".join(["a"] * processor.max_length)
        try:
            empty, full = self.encode(request, [(request.query, ""), (request.query, filler)])()
        except BadRequest:  # a processor that never cuts (a causal CrossEncoder's template)
            (empty,) = self.encode(request, [(request.query, "")])()
            return len(empty), processor.max_length
        return empty.truncated_from or len(empty), min(len(full), processor.max_length)
