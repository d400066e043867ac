"""What the routes answer, for the OpenAPI schema only.

The model routes answer orjson bytes built by their operations (``ember.api.operations``,
``cohere``, ``tei``); nothing here validates or serialises a response. These models describe
those bytes, and a test checks each against a real answer. Building the answers through
these models instead was timed for an OpenAI answer of 32 x 384 floats: 2.4x the orjson
dict's time with ``model_construct``, 4.8x validated, so they stay the schema only.
Every error, whatever the route, has one shape (``ember.errors.error_body``):
``ErrorResponse``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, RootModel


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(
        description="invalid_request_error, authentication_error, not_found_error, "
        "rate_limit_error, timeout_error, service_unavailable or server_error."
    )
    param: str | None = Field(description="The request field at fault, where one is.")
    code: int = Field(description="The HTTP status.")


class ErrorResponse(BaseModel):
    """Every non-2xx answer (OpenAI's error shape)."""

    error: ErrorDetail


# What each error status means, on whichever route lists it.
ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "Malformed JSON, or a request the model cannot serve: a task or output it lacks, "
    "text over its max tokens with `truncate: false`, no `model` with several served.",
    401: "Missing or wrong API key (with `--api-key` or `--api-keys-file`).",
    403: "The API key may not use this model or route (`--api-keys-file`), or the route "
    "needs an admin key.",
    408: "Any route: the request head did not arrive within `--header-timeout`, or its body "
    "stalled for `--body-timeout`; the connection closes.",
    404: "`model` names no served model.",
    413: "Body over `--payload-limit`, or more inputs than `--max-client-batch-size`.",
    422: "The body does not fit the schema.",
    431: "Any route: the request head is over 16 KiB or 100 header lines.",
    429: "The model cannot take the request in time (queue full or too long a wait), or the "
    "API key is over one of its own limits (the message names it); retry after `Retry-After`.",
    500: "A forward pass failed (only the requests in its batch), or an internal error.",
    499: "Never read by a client: what the metrics and the log record when the client left "
    "before its answer (its queued inputs are dropped).",
    503: "The model is still loading, or loading failed; on any route, a new connection "
    "past `--max-connections`.",
    504: "The request waited past `--request-timeout`.",
}

ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"schema": {"type": "string"}, "description": "`Bearer`"}},
    429: {"Retry-After": {"schema": {"type": "string"}, "description": "Seconds to wait."}},
}

# The statuses a route can answer besides 200, derived from the request path: the edge
# (401, 403 and 429 by the key's own rules, 413), validation (400 malformed JSON, 422), the
# engine array (400, 404, 403 for a model the key may not use), the batch limit (413),
# admission and deadline (429, 504), loading (503), a failed forward (500), a client gone
# before its answer (499, recorded only).
MODEL_ERRORS = (400, 401, 403, 404, 413, 422, 429, 499, 500, 503, 504)
# /tokenize and /decode run on the tokenizer only: no queue, so no 504 (429 only by a key).
TOKENIZER_ERRORS = (400, 401, 403, 404, 413, 422, 429, 499, 500, 503)
# What the connection layer (ember.api.connections) answers on any route, before routing.
CONNECTION_ERRORS = (408, 431, 503)

TIMING_HEADERS: dict[str, Any] = {
    name: {"schema": {"type": "string"}, "description": "Milliseconds."}
    for name in (
        "x-tokenization-time",
        "x-queue-time",
        "x-inference-time",
        "x-serialization-time",
        "x-total-time",
    )
}


def error_responses(statuses: tuple[int, ...]) -> dict[int | str, dict[str, Any]]:
    """``add_api_route(responses=...)`` entries: each status with the one error model."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[status]}
        if status in ERROR_HEADERS:
            entry["headers"] = ERROR_HEADERS[status]
        out[status] = entry
    return out


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


# OpenAI /v1/embeddings


class SparseEmbedding(BaseModel):
    indices: list[int]
    values: list[float]


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    embedding: list[float] | list[list[float]] | SparseEmbedding | str = Field(
        description="Dense: [float]; ColBERT: one vector per kept token; SPLADE: indices "
        "and values; base64: little-endian float32 bytes."
    )
    index: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: Usage
    id: str = Field(description="Infinity's: unique per answer.")
    created: int = Field(description="Infinity's: Unix seconds.")


# Cohere rerank and Infinity-style classify share one envelope.


class RerankDocumentOut(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocumentOut | None = Field(None, description="With `return_documents`.")


class RerankResponse(BaseModel):
    id: str
    object: Literal["rerank"]
    results: list[RerankResult]
    model: str
    usage: Usage
    created: int


class InfinityRerankResult(BaseModel):
    index: int
    relevance_score: float
    document: str | None = Field(description="The document; null without `return_documents`.")


class InfinityRerankResponse(RerankResponse):
    """Infinity's answer on its ``/rerank``: Cohere's envelope, ``document`` a string."""

    results: list[InfinityRerankResult]  # type: ignore[assignment]


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["classify"]
    data: list[list[LabelScore]] = Field(description="Per input: every label, best first.")
    model: str
    usage: Usage
    created: int


# Cohere /v1/embed, /v2/embed


class ApiVersion(BaseModel):
    version: str


class BilledUnits(BaseModel):
    input_tokens: int


class EmbedMeta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits


class EmbeddingsByType(BaseModel):
    # Named ``float`` in JSON; ``float_`` here so the name does not hide the type.
    float_: list[list[float]] | None = Field(None, alias="float")
    int8: list[list[int]] | None = None
    uint8: list[list[int]] | None = None
    binary: list[list[int]] | None = None
    ubinary: list[list[int]] | None = None
    base64: list[str] | None = None


class CohereEmbedResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: list[list[float]] | EmbeddingsByType = Field(
        description="embeddings_floats: a list of float lists; embeddings_by_type: an "
        "object keyed by the asked `embedding_types`."
    )
    texts: list[str]
    meta: EmbedMeta


# TEI


class TEIRank(BaseModel):
    index: int
    score: float
    text: str | None = Field(None, description="With `return_text`.")


class SparseValue(BaseModel):
    index: int
    value: float


class Token(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TEIEmbedResponse(RootModel[list[list[float]]]):
    """One vector per input."""


class TEIEmbedSparseResponse(RootModel[list[list[SparseValue]]]):
    """Per input: the non-zero weights, sorted by index."""


class TEIEmbedAllResponse(RootModel[list[list[list[float]]]]):
    """Per input: one vector per kept token."""


class TEIPredictResponse(RootModel[list[LabelScore] | list[list[LabelScore]]]):
    """Every label, best first: one list for a string input, a list of them for a list."""


class TokenizeResponse(RootModel[list[list[Token]]]):
    """Per input: its tokens."""


class DecodeResponse(RootModel[list[str]]):
    """One text per id list."""


class SimilarityResponse(RootModel[list[float]]):
    """The cosine of the source sentence to each sentence."""


class AnyRerankResponse(RootModel[InfinityRerankResponse | list[TEIRank]]):
    """Infinity's answer for a ``documents`` body, TEI's list for a ``texts`` body."""


class RootResponse(
    RootModel[
        list[list[float]]
        | list[list[SparseValue]]
        | list[list[list[float]]]
        | list[LabelScore]
        | list[list[LabelScore]]
        | list[TEIRank]
        | list[float]
    ]
):
    """What the route it stands for answers: /embed, /embed_sparse, /embed_all, /predict
    (``[[{"label", "score"}]]`` with the Inference API's ``parameters``), /rerank (TEI's)
    or /similarity."""


# The other routes


class ModelStats(BaseModel):
    """Infinity's queue figures for one model."""

    queue_fraction: float = Field(description="Inputs admitted and unanswered / --max-queue-size.")
    queue_absolute: int = Field(description="Inputs admitted and not yet answered.")
    batch_size: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    owned_by: str = Field(description="`infinity`: the one value Infinity's client accepts.")
    created: int
    ready: bool
    stats: ModelStats
    task: str | None = None
    kind: str | None = None
    capabilities: list[str] | None = None
    backend: str | None = None
    device: str | None = None
    dtype: str | None = None
    backend_details: dict[str, Any] | None = None
    max_input_length: int | None = None
    dimensions: int | None = Field(
        None, description="Width of a dense embedding, after the model's Dense layers."
    )
    max_model_len: int | None = Field(
        None, description="vLLM's name (read by mteb's and vLLM's clients): max input tokens."
    )


class ModelsResponse(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class InfoResponse(BaseModel):
    """TEI's /info for the first model (the model facts once it has loaded)."""

    model_id: str
    version: str
    models: list[str]
    max_client_batch_size: int
    model_sha: str | None = None
    model_dtype: str | None = None
    model_type: dict[str, Any] | None = None
    backend: str | None = None
    device: str | None = None
    backend_details: dict[str, Any] | None = Field(
        None, description="As /v1/models says it: what `--backend auto` chose and why."
    )
    max_input_length: int | None = None
    dimensions: int | None = Field(
        None, description="Width of the first model's dense embedding, after its Dense layers."
    )
    max_batch_tokens: int | None = None
    max_batch_requests: int | None = None
    max_concurrent_requests: int | None = None


class HealthResponse(BaseModel):
    status: Literal["ok"]
    unix: float = Field(description="The server's clock (Infinity's health answer).")


class HealthNotReady(BaseModel):
    status: Literal["loading", "failed"] = Field(
        description="loading: a model is still loading or warming up; failed: one failed "
        "to load (the log and /ready say why)."
    )


class LiveResponse(BaseModel):
    status: Literal["alive"]


class KeyUsageReport(BaseModel):
    requests: int = Field(description="Requests answered, every status.")
    inputs: int = Field(description="Inputs the engine served (cache hits included).")
    tokens: int
    statuses: dict[str, int] = Field(description="Requests by answer status.")
    errors: dict[str, int] = Field(description="Requests answered 4xx or 5xx, by status.")
    in_flight: int
    active: bool = Field(description="False once a reload revoked the key.")


class UsageReport(BaseModel):
    keys: dict[str, KeyUsageReport]


class ReadyResponse(BaseModel):
    status: Literal["ready"]
    models: list[str]


# vLLM /score


class ScoreItem(BaseModel):
    index: int
    object: Literal["score"]
    score: float


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"]
    created: int
    model: str
    data: list[ScoreItem] = Field(description="One score per (text_1, text_2) pair, in order.")
    usage: Usage
