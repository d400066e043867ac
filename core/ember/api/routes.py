"""The route table: every model route once, with its body, operation and answers.

The FastAPI app (``ember.api.app``), its fast path and the platform adapters
(``ember.platform.dispatch_route``) all dispatch on these rows, through one request path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any

from pydantic import Discriminator, Tag, TypeAdapter

from ember.api import operations as ops
from ember.api import responses as r
from ember.api import schemas as s
from ember.api import tei
from ember.api.dialects import cohere, infinity, openai, vllm
from ember.api.dialects import tei as tei_dialect
from ember.api.operations import Operation, translated
from ember.engine.array import EngineArray


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
        return await ops.run(tei_dialect.RERANK, engines, body, limit)
    return await ops.run(infinity.RERANK, engines, body, limit)


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
        translated(openai.EMBEDDINGS),
        "Create embeddings (OpenAI-compatible)",
        "OpenAI",
        r.EmbeddingsResponse,
    ),
    ModelRoute(
        ("/embeddings_image",),
        s.MediaEmbeddingsRequest,
        translated(infinity.EMBEDDINGS_IMAGE),
        "Embed images (Infinity's legacy route: /v1/embeddings with modality image)",
        "Infinity",
        r.EmbeddingsResponse,
    ),
    ModelRoute(
        ("/embeddings_audio",),
        s.MediaEmbeddingsRequest,
        translated(infinity.EMBEDDINGS_AUDIO),
        "Embed audio (Infinity's legacy route: /v1/embeddings with modality audio)",
        "Infinity",
        r.EmbeddingsResponse,
    ),
    ModelRoute(
        ("/v1/rerank", "/v2/rerank"),
        s.RerankRequest,
        translated(cohere.RERANK),
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
        vllm.ScoreRequest,
        translated(vllm.SCORE),
        "Score text pairs: cross-encoder, LLM reranker, MaxSim or cosine (vLLM-compatible)",
        "vLLM",
        r.ScoreResponse,
    ),
    ModelRoute(
        ("/v1/embed",),
        cohere.CohereEmbedRequest,
        translated(cohere.EMBED),
        "Embed with output types (Cohere v1-compatible)",
        "Cohere",
        r.CohereEmbedResponse,
    ),
    ModelRoute(
        ("/v2/embed",),
        cohere.CohereEmbedV2Request,
        translated(cohere.EMBED),
        "Embed with output types (Cohere v2-compatible)",
        "Cohere",
        r.CohereEmbedResponse,
    ),
    ModelRoute(
        ("/classify",),
        s.ClassifyRequest,
        translated(infinity.CLASSIFY),
        "Classify texts",
        "Classify",
        r.ClassifyResponse,
    ),
    ModelRoute(
        ("/predict",),
        s.TEIPredictRequest,
        translated(tei_dialect.PREDICT),
        "Classify texts (TEI-compatible)",
        "TEI",
        r.TEIPredictResponse,
    ),
    ModelRoute(
        ("/embed",),
        s.TEIEmbedRequest,
        translated(tei_dialect.EMBED),
        "Embed (TEI-compatible)",
        "TEI",
        r.TEIEmbedResponse,
    ),
    ModelRoute(
        ("/embed_sparse",),
        s.TEIEmbedOutputRequest,
        translated(tei_dialect.EMBED_SPARSE),
        "Sparse embeddings: SPLADE, BGE-M3 (TEI-compatible)",
        "TEI",
        r.TEIEmbedSparseResponse,
    ),
    ModelRoute(
        ("/embed_all",),
        s.TEIEmbedOutputRequest,
        translated(tei_dialect.EMBED_ALL),
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
        tei_dialect.SimilarityRequest,
        translated(tei_dialect.SIMILARITY),
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
