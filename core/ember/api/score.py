"""vLLM's ``POST /score`` (and ``/v1/score``): ``text_1`` against ``text_2``, 1:1, 1:N or N:N.

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
from typing import Annotated

import numpy as np
from pydantic import AliasChoices, Field

from ember.api import operations as ops
from ember.api import schemas as s
from ember.engine import Engine, EngineArray, Result, Timings
from ember.engine.requests import EmbedRequest, RerankRequest
from ember.errors import BadRequest
from ember.outputs import DenseVectors, is_dense

ScoreInput = s.NonEmptyText | Annotated[list[s.NonEmptyText], Field(min_length=1)]


class ScoreRequest(s._Body):
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


async def score(engines: EngineArray, body: ScoreRequest, limit: int) -> ops.Reply:
    firsts, seconds = pair_up(body.text_1, body.text_2)
    ops.check_batch(len(seconds), limit, "text_2")
    if body.truncate_prompt_tokens not in (None, -1):
        raise BadRequest(
            "truncate_prompt_tokens on /score takes -1 (the model's max length) only: Ember "
            "cuts a pair at the model's max length; /v1/embeddings takes any count",
            param="truncate_prompt_tokens",
        )
    engine = engines.for_task(body.model, "rerank")
    if (
        engine.model is not None
        and not engine.family.does("rerank")
        and is_dense(engine.family.embedding)
    ):
        scores, result = await _cosine(engine, firsts, seconds)
    else:
        scores, result = await _rerank(engine, firsts, seconds, raw=body.use_activation is False)
    data = [{"index": i, "object": "score", "score": float(v)} for i, v in enumerate(scores)]
    return ops.Reply(
        {
            "id": f"score-{uuid.uuid4().hex}",
            "object": "list",
            "created": int(time.time()),
            "model": engine.name,
            "data": data,
            "usage": {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens},
        },
        result.timings,
    )


async def _rerank(
    engine: Engine, firsts: list[str], seconds: list[str], *, raw: bool
) -> tuple[np.ndarray, Result]:
    """One rerank call per distinct text_1, run together; scores back in pair order."""
    groups: dict[str, list[int]] = {}
    for i, first in enumerate(firsts):
        groups.setdefault(first, []).append(i)
    results = await asyncio.gather(
        *(
            engine.rerank(RerankRequest(first, [seconds[i] for i in where], raw_scores=raw))
            for first, where in groups.items()
        )
    )
    scores = np.empty(len(firsts), dtype=np.float64)
    for where, result in zip(groups.values(), results, strict=True):
        scores[where] = result.outputs
    return scores, _merged(results)


async def _cosine(
    engine: Engine, firsts: list[str], seconds: list[str]
) -> tuple[np.ndarray, Result]:
    """A dense model's cosine of each pair, every distinct text embedded once."""
    distinct = list(dict.fromkeys([*firsts, *seconds]))
    result = await engine.embed(EmbedRequest(distinct, output=DenseVectors.kind, normalize=True))
    row = {text: i for i, text in enumerate(distinct)}
    assert isinstance(result.output, DenseVectors)
    cosines = result.output.cosine([row[t] for t in firsts], [row[t] for t in seconds])
    return cosines.values, result


def _merged(results: list[Result]) -> Result:
    """Calls that ran at once: their tokens add up, each stage took the longest one's time."""
    timings = Timings(
        tokenize=max(r.timings.tokenize for r in results),
        queue=max(r.timings.queue for r in results),
        forward=max(r.timings.forward for r in results),
    )
    return Result(None, sum(r.prompt_tokens for r in results), timings)
