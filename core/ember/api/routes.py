"""The route table: every model route once, with its body, operation and answers.

The FastAPI app (``ember.api.app``), its fast path and the platform adapters
(``ember.platform.dispatch_route``) all dispatch on these rows, through one request path.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any

from pydantic import Discriminator, RootModel, Tag, TypeAdapter

from ember.api import operations as ops
from ember.api.dialects import cohere, infinity, openai, tei, vllm
from ember.api.operations import Operation, Reply, answer_of, translated
from ember.engine.array import EngineArray

# The statuses a route can answer besides 200, derived from the request path: the edge
# (401, 403 and 429 by the key's own rules, 413), validation (400 malformed JSON, 422), the
# engine array (400, 404, 403 for a model the key may not use), the batch limit (413),
# admission and deadline (429, 504), loading (503), a failed forward (500), a client gone
# before its answer (499, recorded only).
MODEL_ERRORS = (400, 401, 403, 404, 413, 422, 429, 499, 500, 503, 504)
# /tokenize and /decode run on the tokenizer only: no queue, so no 504 (429 only by a key).
TOKENIZER_ERRORS = (400, 401, 403, 404, 413, 422, 429, 499, 500, 503)


def _rerank_kind(value: Any) -> str:
    return "tei" if isinstance(value, dict) and "texts" in value else "cohere"


AnyRerankRequest = Annotated[
    Annotated[cohere.RerankRequest, Tag("cohere")] | Annotated[tei.TEIRerankRequest, Tag("tei")],
    Discriminator(_rerank_kind),
]


class AnyRerankResponse(RootModel[infinity.InfinityRerankResponse | list[tei.TEIRank]]):
    """Infinity's answer for a ``documents`` body, TEI's list for a ``texts`` body."""


async def rerank_either(engines: EngineArray, body: Any, limit: int) -> Reply[AnyRerankResponse]:
    """``/rerank`` is Infinity's route and TEI's: Infinity's body (``documents``, Cohere's
    fields) gets Infinity's answer, TEI's (``texts``) TEI's."""
    if isinstance(body, tei.TEIRerankRequest):
        return await ops.run(tei.RERANK, engines, body, limit)
    return await ops.run(infinity.RERANK, engines, body, limit)


@dataclass(frozen=True)
class ModelRoute:
    paths: tuple[str, ...]
    body: Any
    operation: Operation
    summary: str
    tag: str
    errors: tuple[int, ...] = MODEL_ERRORS  # every other status it can answer

    @cached_property
    def answer(self) -> Any:
        """The 200 body's model: what the operation's code returns (``answer_of``)."""
        return answer_of(self.operation)

    @cached_property
    def adapter(self) -> TypeAdapter[Any]:
        """The body's validator, built once: the fast path and the adapters' dispatch use it."""
        return TypeAdapter(self.body)


ROUTES = (
    ModelRoute(
        ("/v1/embeddings", "/embeddings"),
        openai.EmbeddingsRequest,
        translated(openai.EMBEDDINGS),
        "Create embeddings (OpenAI-compatible)",
        "OpenAI",
    ),
    ModelRoute(
        ("/embeddings_image",),
        infinity.MediaEmbeddingsRequest,
        translated(infinity.EMBEDDINGS_IMAGE),
        "Embed images (Infinity's legacy route: /v1/embeddings with modality image)",
        "Infinity",
    ),
    ModelRoute(
        ("/embeddings_audio",),
        infinity.MediaEmbeddingsRequest,
        translated(infinity.EMBEDDINGS_AUDIO),
        "Embed audio (Infinity's legacy route: /v1/embeddings with modality audio)",
        "Infinity",
    ),
    ModelRoute(
        ("/v1/rerank", "/v2/rerank"),
        cohere.RerankRequest,
        translated(cohere.RERANK),
        "Rerank documents (Cohere-compatible)",
        "Cohere",
    ),
    ModelRoute(
        ("/rerank",),
        AnyRerankRequest,
        rerank_either,
        "Rerank: Infinity's body and answer (`documents`; `document` a string) or TEI's (`texts`)",
        "Infinity / TEI",
    ),
    ModelRoute(
        ("/score", "/v1/score"),
        vllm.ScoreRequest,
        translated(vllm.SCORE),
        "Score text pairs: cross-encoder, LLM reranker, MaxSim or cosine (vLLM-compatible)",
        "vLLM",
    ),
    ModelRoute(
        ("/v1/embed",),
        cohere.CohereEmbedRequest,
        translated(cohere.EMBED),
        "Embed with output types (Cohere v1-compatible)",
        "Cohere",
    ),
    ModelRoute(
        ("/v2/embed",),
        cohere.CohereEmbedV2Request,
        translated(cohere.EMBED),
        "Embed with output types (Cohere v2-compatible)",
        "Cohere",
    ),
    ModelRoute(
        ("/classify",),
        infinity.ClassifyRequest,
        translated(infinity.CLASSIFY),
        "Classify texts",
        "Classify",
    ),
    ModelRoute(
        ("/predict",),
        tei.TEIPredictRequest,
        translated(tei.PREDICT),
        "Classify texts (TEI-compatible)",
        "TEI",
    ),
    ModelRoute(
        ("/embed",),
        tei.TEIEmbedRequest,
        translated(tei.EMBED),
        "Embed (TEI-compatible)",
        "TEI",
    ),
    ModelRoute(
        ("/embed_sparse",),
        tei.TEIEmbedOutputRequest,
        translated(tei.EMBED_SPARSE),
        "Sparse embeddings: SPLADE, BGE-M3 (TEI-compatible)",
        "TEI",
    ),
    ModelRoute(
        ("/embed_all",),
        tei.TEIEmbedOutputRequest,
        translated(tei.EMBED_ALL),
        "Multi-vector embeddings: ColBERT, BGE-M3 (TEI-compatible)",
        "TEI",
    ),
    ModelRoute(
        ("/tokenize",),
        tei.TEITokenizeRequest,
        tei.tokenize,
        "Tokenize (TEI-compatible)",
        "TEI",
        TOKENIZER_ERRORS,
    ),
    ModelRoute(
        ("/decode",),
        tei.DecodeRequest,
        tei.decode,
        "Token ids to text (TEI-compatible)",
        "TEI",
        TOKENIZER_ERRORS,
    ),
    ModelRoute(
        ("/similarity",),
        tei.SimilarityRequest,
        translated(tei.SIMILARITY),
        "Sentence similarity: cosine of a source sentence to others (TEI-compatible)",
        "TEI",
    ),
    ModelRoute(
        ("/",),
        tei.RootRequest,
        tei.root,
        "By the body and the model's kind: embed, predict, rerank or similarity (TEI-compatible)",
        "TEI",
    ),
)


# Every model route by path: the fast path and the platform adapters dispatch on it.
ROUTES_BY_PATH: dict[str, ModelRoute] = {path: route for route in ROUTES for path in route.paths}
