"""TEI's compatibility routes: ``POST /``, ``/similarity``, ``/decode``, and ``/tokenize``
with no ``model``; enough for Hugging Face's ``InferenceClient`` pointed at the server.

What TEI does (``router/src/http/server.rs``): ``/`` is bound at start-up to one handler by
the served model's type: ``/predict`` for a classifier, ``/rerank`` for a reranker, and for
an embedding model ``/embed`` (``/embed_sparse`` for SPLADE, ``/similarity`` when started
with ``TASK=sentence-similarity``). ``/similarity`` embeds the source sentence and the
others and answers their cosine similarities; ``/decode`` answers one string per id list.

What ``InferenceClient`` (huggingface_hub 2.4, provider ``hf-inference``, which posts to a
URL given as ``model`` as it is) sends, read from its source:
- ``feature_extraction``: ``{"inputs", "normalize", "prompt_name", "truncate",
  "truncation_direction", "dimensions", "encoding_format"}`` at the top level, unset ones
  left out; it reads ``[[float]]``.
- ``sentence_similarity``: ``{"inputs": {"source_sentence", "sentences"}, "parameters": {}}``;
  it reads ``[float]``.
- ``text_classification``: ``{"inputs", "parameters": {"function_to_apply", "top_k"}}``,
  ``parameters`` always sent (``{}`` when both are unset); it reads ``[[{"label", "score"}]]``
  and returns the inner list (TEI's flat ``[{"label", "score"}]`` would give it only the
  best label), so a body with ``parameters`` gets the nested shape.

Ember serves several models, so ``/`` reads the body first: ``{"query", "texts"}`` reranks,
an ``inputs`` object is a similarity, and text ``inputs`` goes by the model's kind as on
TEI (a classifier predicts, an embedding model embeds). With no ``model`` and several
served, text ``inputs`` goes to the model that embeds, and with ``parameters`` (the
Inference API's classification body) to the model that classifies.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag

from ember.api import operations as ops
from ember.api import schemas as s
from ember.api.dialects import tei
from ember.api.dialects.tei import RootInputsRequest, SimilarityRequest
from ember.api.operations import Reply, check_batch
from ember.api.schemas import StrictBool, TokenIds, _Body
from ember.engine import Engine, EngineArray, Timings
from ember.errors import BadRequest, NotReady
from ember.outputs import DenseVectors, MultiVectors, SparseVectors, output_type


class DecodeRequest(_Body):
    """TEI ``POST /decode``."""

    ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1)] = Field(
        description="One token-id list or a list of them."
    )
    skip_special_tokens: StrictBool = True
    model: str | None = None


def _root_kind(value: Any) -> str:
    if isinstance(value, dict):
        if "texts" in value:
            return "rerank"
        if isinstance(value.get("inputs"), dict):
            return "similarity"
    return "inputs"


RootRequest = Annotated[
    Annotated[RootInputsRequest, Tag("inputs")]
    | Annotated[SimilarityRequest, Tag("similarity")]
    | Annotated[s.TEIRerankRequest, Tag("rerank")],
    Discriminator(_root_kind),
]


async def decode(engines: EngineArray, body: DecodeRequest, limit: int) -> Reply:
    """One text per id list (TEI answers a list even for one)."""
    ids = body.ids if isinstance(body.ids[0], list) else [body.ids]
    check_batch(len(ids), limit, "ids")
    engine = engines.tokenizing(body.model)
    processor = engine.processor
    if processor is None:
        raise NotReady(f"model {engine.name!r} is still loading")
    texts = await asyncio.to_thread(
        processor.decode,
        ids,
        skip_special_tokens=body.skip_special_tokens,
    )
    return Reply(texts, Timings())


async def tokenize(engines: EngineArray, body: s.TEITokenizeRequest, limit: int) -> Reply:
    """/tokenize; with no ``model`` and several served, the first model that tokenises."""
    engine = engines.tokenizing(body.model)
    return await ops.tei_tokenize(engines, body.model_copy(update={"model": engine.name}), limit)


def _root_engine(engines: EngineArray, body: RootInputsRequest) -> Engine:
    if body.model or len(engines.engines) == 1:
        engine = engines.get(body.model)
    else:
        embeds = any(e.model is not None and e.family.does("embed") for e in engines)
        asked = "classify" if body.parameters is not None or not embeds else "embed"
        engine = engines.for_task(None, asked)
    if engine.model is None:
        raise NotReady(f"model {engine.name!r} is still loading")
    return engine


async def root(engines: EngineArray, body: Any, limit: int) -> Reply:
    """``POST /``: the body says rerank or similarity; text ``inputs`` go by the model's
    kind (predict for a classifier, else its embedding: dense, sparse or multi-vector)."""
    if isinstance(body, s.TEIRerankRequest):
        return await ops.run(tei.RERANK, engines, body, limit)
    if isinstance(body, SimilarityRequest):
        return await ops.run(tei.SIMILARITY, engines, body, limit)
    engine = _root_engine(engines, body)
    kind, name = engine.family, engine.name
    named = body.model_copy(update={"model": name})
    if kind.classifies:
        if body.parameters is not None:
            return await ops.run(tei.INFERENCE_CLASSIFY, engines, named, limit)
        return await ops.run(tei.PREDICT, engines, named, limit)
    embedding = output_type(kind.embedding) if kind.embedding is not None else None
    if embedding is DenseVectors:
        return await ops.run(tei.EMBED, engines, named, limit)
    if embedding is SparseVectors or embedding is MultiVectors:
        run = tei.EMBED_SPARSE if embedding is SparseVectors else tei.EMBED_ALL
        return await ops.run(run, engines, named, limit)
    raise BadRequest(
        f"model {name!r} ({kind.name}) does not embed or classify; it serves {kind.serves()}: "
        'send {"query", "texts"} to rerank',
        param="inputs",
    )
