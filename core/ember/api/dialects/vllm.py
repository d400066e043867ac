"""vLLM's dialect: ``POST /score`` (and ``/v1/score``), ``text_1`` against ``text_2``,
1:1, 1:N or N:N.

A cross-encoder, an LLM reranker or a late-interaction (MaxSim) model scores the pairs
through ``Engine.rerank``, the call the rerank routes make: one call per distinct
``text_1``, with all its ``text_2`` together, so a 1:N body is one rerank. A dense
embedding model scores by cosine, as vLLM's bi-encoder path does. The body and the answer
are vLLM's (``vllm/entrypoints/pooling/score/protocol.py``: ``ScoreRequest``,
``ScoreResponse``); its later names for the two sides (``data_1``/``data_2``,
``queries``/``documents``, ``queries``/``items``) are taken too.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AliasChoices, BaseModel, Field

from ember.api import schemas as s
from ember.api.dialects import Translator, Usage, of, usage
from ember.api.dialects.long_rerank import LongRerankFields, RerankChunk, chunk_of
from ember.chunking import Span
from ember.engine import Engine, Result, Timings
from ember.engine.requests import EmbedRequest, RerankRequest
from ember.errors import BadRequest
from ember.outputs import ChunkedScores, DenseVectors, Scores, is_dense

ScoreInput = s.NonEmptyText | Annotated[list[s.NonEmptyText], Field(min_length=1)]


class ScoreRequest(LongRerankFields):
    """vLLM ``POST /score``."""

    model: str | None = None
    text_1: ScoreInput = Field(
        validation_alias=AliasChoices("text_1", "data_1", "queries"),
        description="One text (scored against every text_2) or one per text_2 (pairwise).",
    )
    text_2: ScoreInput = Field(
        validation_alias=AliasChoices("text_2", "data_2", "documents", "items")
    )
    truncate_prompt_tokens: s.StrictInt | None = Field(
        None,
        description="-1: cut pairs at the model's max length (what Ember does anyway); "
        "other values are refused (400) on /score.",
    )
    use_activation: s.StrictBool | None = Field(
        None, description="false: raw logits (Ember's raw_scores); default: sigmoid scores."
    )


class ScoreItem(BaseModel):
    index: int
    object: Literal["score"]
    score: float
    chunk: RerankChunk | None = Field(
        None,
        description="With `max_tokens_per_doc` / `max_chunks_per_doc`: text_2's best chunk.",
    )


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreItem] = Field(description="One score per (text_1, text_2) pair, in order.")
    usage: Usage


def pair_up(text_1: str | list[str], text_2: str | list[str]) -> tuple[list[str], list[str]]:
    """vLLM's pairing: one text_1 goes with every text_2 (1:N), else they pair by position
    (N:N, same lengths)."""
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    if len(firsts) > 1 and len(firsts) != len(seconds):
        raise BadRequest(
            f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: input lengths must be "
            "1:1, 1:N or N:N",
            param="text_1",
        )
    return (firsts * len(seconds) if len(firsts) == 1 else firsts), seconds


@dataclass(frozen=True)
class PairScores:
    """/score's engine requests: one rerank per distinct text_1 with the pairs it scores
    (``reranks``), or, for a dense model, one embedding of every distinct text
    (``embed``) and each pair's two rows (``left``, ``right``)."""

    reranks: tuple[tuple[RerankRequest, list[int]], ...] = ()
    embed: EmbedRequest | None = None
    left: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)
    pairs: int = 0


class Score(Translator[ScoreRequest, PairScores]):
    """``/score``, ``/v1/score``: vLLM's list of scores, one per pair in order."""

    capability = "rerank"
    field = "text_2"

    def count(self, body: ScoreRequest) -> int:
        return len(pair_up(body.text_1, body.text_2)[1])

    def decode(self, body: ScoreRequest, engine: Engine) -> PairScores:
        if body.truncate_prompt_tokens not in (None, -1):
            raise BadRequest(
                "truncate_prompt_tokens on /score takes -1 (the model's max length) only: "
                "Ember cuts a pair at the model's max length; /v1/embeddings takes any count",
                param="truncate_prompt_tokens",
            )
        firsts, seconds = pair_up(body.text_1, body.text_2)
        if (
            engine.model is not None
            and not engine.family.does("rerank")
            and is_dense(engine.family.embedding)
        ):  # a dense model's cosine of each pair, every distinct text embedded once
            if body.max_tokens_per_doc is not None or body.max_chunks_per_doc is not None:
                raise BadRequest(
                    f"max_tokens_per_doc and max_chunks_per_doc score a reranker's chunks; "
                    f"model {engine.name!r} scores pairs by the cosine of whole embeddings",
                    param="max_tokens_per_doc",
                )
            distinct = list(dict.fromkeys([*firsts, *seconds]))
            row = {text: i for i, text in enumerate(distinct)}
            return PairScores(
                embed=EmbedRequest(distinct, output=DenseVectors.kind, normalize=True),
                left=[row[t] for t in firsts],
                right=[row[t] for t in seconds],
                pairs=len(firsts),
            )
        groups: dict[str, list[int]] = {}
        for i, first in enumerate(firsts):
            groups.setdefault(first, []).append(i)
        raw = body.use_activation is False
        chunking = body.chunking()
        reranks = tuple(
            (RerankRequest(first, [seconds[i] for i in where], raw_scores=raw, **chunking), where)
            for first, where in groups.items()
        )
        return PairScores(reranks=reranks, pairs=len(firsts))

    async def call(self, engine: Engine, request: PairScores) -> Result:
        """The cosines, or one rerank call per distinct text_1, run together; the scores
        back in pair order."""
        if request.embed is not None:
            result = await engine.embed(request.embed)
            assert isinstance(result.output, DenseVectors)
            result.output = result.output.cosine(request.left, request.right)
            return result
        results = await asyncio.gather(*(engine.rerank(r) for r, _ in request.reranks))
        scores = np.empty(request.pairs, dtype=np.float64)
        for (_, where), result in zip(request.reranks, results, strict=True):
            scores[where] = result.outputs
        return _merged(results, _in_pair_order(request, results, scores))

    def encode(self, body: ScoreRequest, engine: Engine, result: Result) -> ScoreResponse:
        assert isinstance(result.output, Scores)
        data = []
        for i, v in enumerate(result.output.values):
            fields: dict[str, Any] = {"index": i, "object": "score", "score": float(v)}
            chunk = chunk_of(result.output, i)
            if chunk is not None:
                fields["chunk"] = chunk
            data.append(of(ScoreItem, **fields))
        return of(
            ScoreResponse,
            id=f"score-{uuid.uuid4().hex}",
            object="list",
            created=int(time.time()),
            model=engine.name,
            data=data,
            usage=usage(result.prompt_tokens),
        )


def _in_pair_order(request: PairScores, results: list[Result], scores: np.ndarray) -> Scores:
    """The rerank calls' scores in pair order, with each pair's best chunk when chunked."""
    if not all(isinstance(r.output, ChunkedScores) for r in results):
        return Scores(scores)
    chunks: dict[int, tuple[int, Span]] = {}
    for (_, where), result in zip(request.reranks, results, strict=True):
        output = result.output
        assert isinstance(output, ChunkedScores)
        for k, i in enumerate(where):
            chunks[i] = (output.best[k], output.spans[k])
    pairs = range(request.pairs)
    return ChunkedScores(scores, [chunks[i][0] for i in pairs], [chunks[i][1] for i in pairs])


def _merged(results: list[Result], output: Scores) -> Result:
    """Calls that ran at once: their tokens and cut inputs add up, each stage took the
    longest one's time."""
    timings = Timings(
        tokenize=max(r.timings.tokenize for r in results),
        queue=max(r.timings.queue for r in results),
        forward=max(r.timings.forward for r in results),
        truncated=sum(r.timings.truncated for r in results),
    )
    return Result(output, sum(r.prompt_tokens for r in results), timings)


SCORE = Score()
