"""The route table: every model route once, with its body, operation and answers.

The FastAPI app (``ember.api.app``), its fast path and the platform adapters
(``ember.platform.dispatch_route``) all dispatch on these rows, through one request path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any

from pydantic import Discriminator, Tag, TypeAdapter

from ember.api import cohere, score, tei
from ember.api import operations as ops
from ember.api import responses as r
from ember.api import schemas as s
from ember.engine.array import EngineArray

Operation = Callable[[EngineArray, Any, int], Awaitable[ops.Reply]]


def _rerank_kind(value: Any) -> str:
    return "tei" if isinstance(value, dict) and "texts" in value else "cohere"


AnyRerankRequest = Annotated[
    Annotated[s.RerankRequest, Tag("cohere")] | Annotated[s.TEIRerankRequest, Tag("tei")],
    Discriminator(_rerank_kind),
]


async def rerank_either(engines: EngineArray, body: Any, limit: int) -> ops.Reply:
    """``/rerank`` is Infinity's route and TEI's: Infinity's body (``documents``, Cohere's
    fields) gets Infinity's answer, TEI's (``texts``) TEI's."""
    if isinstance(body, s.TEIRerankRequest):
        return await ops.tei_rerank(engines, body, limit)
    return await ops.infinity_rerank(engines, body, limit)


@dataclass(frozen=True)
class ModelRoute:
    paths: tuple[str, ...]
    body: Any
    operation: Operation
    summary: str
    tag: str
    answer: Any  # the 200 body's model, for the schema (the operation builds the bytes)
    errors: tuple[int, ...] = r.MODEL_ERRORS  # every other status it can answer

    @cached_property
    def adapter(self) -> TypeAdapter[Any]:
        """The body's validator, built once: the fast path and the adapters' dispatch use it."""
        return TypeAdapter(self.body)


ROUTES = (
    ModelRoute(
        ("/v1/embeddings", "/embeddings"),
        s.EmbeddingsRequest,
        ops.openai_embeddings,
        "Create embeddings (OpenAI-compatible)",
        "OpenAI",
        r.EmbeddingsResponse,
    ),
    ModelRoute(
        ("/embeddings_image",),
        s.MediaEmbeddingsRequest,
        ops.embeddings_image,
        "Embed images (Infinity's legacy route: /v1/embeddings with modality image)",
        "Infinity",
        r.EmbeddingsResponse,
    ),
    ModelRoute(
        ("/embeddings_audio",),
        s.MediaEmbeddingsRequest,
        ops.embeddings_audio,
        "Embed audio (Infinity's legacy route: /v1/embeddings with modality audio)",
        "Infinity",
        r.EmbeddingsResponse,
    ),
    ModelRoute(
        ("/v1/rerank", "/v2/rerank"),
        s.RerankRequest,
        ops.cohere_rerank,
        "Rerank documents (Cohere-compatible)",
        "Cohere",
        r.RerankResponse,
    ),
    ModelRoute(
        ("/rerank",),
        AnyRerankRequest,
        rerank_either,
        "Rerank: Infinity's body and answer (`documents`; `document` a string) or TEI's (`texts`)",
        "Infinity / TEI",
        r.AnyRerankResponse,
    ),
    ModelRoute(
        ("/score", "/v1/score"),
        score.ScoreRequest,
        score.score,
        "Score text pairs: cross-encoder, LLM reranker, MaxSim or cosine (vLLM-compatible)",
        "vLLM",
        r.ScoreResponse,
    ),
    ModelRoute(
        ("/v1/embed",),
        cohere.CohereEmbedRequest,
        cohere.cohere_embed,
        "Embed with output types (Cohere v1-compatible)",
        "Cohere",
        r.CohereEmbedResponse,
    ),
    ModelRoute(
        ("/v2/embed",),
        cohere.CohereEmbedV2Request,
        cohere.cohere_embed,
        "Embed with output types (Cohere v2-compatible)",
        "Cohere",
        r.CohereEmbedResponse,
    ),
    ModelRoute(
        ("/classify",),
        s.ClassifyRequest,
        ops.classify,
        "Classify texts",
        "Classify",
        r.ClassifyResponse,
    ),
    ModelRoute(
        ("/predict",),
        s.TEIPredictRequest,
        ops.tei_predict,
        "Classify texts (TEI-compatible)",
        "TEI",
        r.TEIPredictResponse,
    ),
    ModelRoute(
        ("/embed",),
        s.TEIEmbedRequest,
        ops.tei_embed,
        "Embed (TEI-compatible)",
        "TEI",
        r.TEIEmbedResponse,
    ),
    ModelRoute(
        ("/embed_sparse",),
        s.TEIEmbedOutputRequest,
        ops.tei_embed_sparse,
        "Sparse embeddings: SPLADE, BGE-M3 (TEI-compatible)",
        "TEI",
        r.TEIEmbedSparseResponse,
    ),
    ModelRoute(
        ("/embed_all",),
        s.TEIEmbedOutputRequest,
        ops.tei_embed_all,
        "Multi-vector embeddings: ColBERT, BGE-M3 (TEI-compatible)",
        "TEI",
        r.TEIEmbedAllResponse,
    ),
    ModelRoute(
        ("/tokenize",),
        s.TEITokenizeRequest,
        tei.tokenize,
        "Tokenize (TEI-compatible)",
        "TEI",
        r.TokenizeResponse,
        r.TOKENIZER_ERRORS,
    ),
    ModelRoute(
        ("/decode",),
        tei.DecodeRequest,
        tei.decode,
        "Token ids to text (TEI-compatible)",
        "TEI",
        r.DecodeResponse,
        r.TOKENIZER_ERRORS,
    ),
    ModelRoute(
        ("/similarity",),
        tei.SimilarityRequest,
        tei.similarity,
        "Sentence similarity: cosine of a source sentence to others (TEI-compatible)",
        "TEI",
        r.SimilarityResponse,
    ),
    ModelRoute(
        ("/",),
        tei.RootRequest,
        tei.root,
        "By the body and the model's kind: embed, predict, rerank or similarity (TEI-compatible)",
        "TEI",
        r.RootResponse,
    ),
)


# Every model route by path: the fast path and the platform adapters dispatch on it.
ROUTES_BY_PATH: dict[str, ModelRoute] = {path: route for route in ROUTES for path in route.paths}
