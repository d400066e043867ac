"""Infinity's own routes: ``/embeddings_image`` and ``/embeddings_audio`` (``/v1/embeddings``
with the modality in the path), ``/rerank`` with Cohere's body (``document`` a string) and
``/classify``; its ``/v1/embeddings`` fields are OpenAI's body's (``ember.api.dialects.openai``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from ember.api.dialects import (
    LabelScore,
    Translator,
    Usage,
    as_list,
    classify_request,
    cohere,
    label_rows,
    of,
)
from ember.api.dialects.long_documents import LongDocumentFields, long_document_options
from ember.api.dialects.long_rerank import RerankChunk
from ember.api.dialects.openai import (
    MODALITY_CAPABILITY,
    EmbeddingsResponse,
    check_base64_dtype,
    embeddings_body,
)
from ember.api.schemas import MediaItem, NonEmptyText, StrictBool, StrictInt, _Body
from ember.capabilities import Capability, Modality
from ember.engine import Engine, Result
from ember.engine.requests import ClassifyRequest as ClassifyCall
from ember.engine.requests import EmbedRequest
from ember.outputs import Labels


class MediaEmbeddingsRequest(LongDocumentFields):
    """Infinity's legacy ``POST /embeddings_image`` and ``/embeddings_audio`` (the
    long-document fields refused: media has no chunks)."""

    input: MediaItem | Annotated[list[MediaItem], Field(min_length=1)] = Field(
        description="An http(s) URL or a data: URI with base64 content, or a list of them."
    )
    model: str | None = Field(None, description="Served model name; any name with one model.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: str | None = None


class ClassifyRequest(_Body):
    """``POST /classify`` (Infinity-style)."""

    input: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    model: str | None = None
    raw_scores: StrictBool = False
    truncate: StrictBool = True


class InfinityRerankResult(BaseModel):
    index: int
    relevance_score: float
    document: str | None = Field(description="The document; null without `return_documents`.")
    chunk: RerankChunk | None = Field(
        None, description="With `max_tokens_per_doc` / `max_chunks_per_doc`: the best chunk."
    )


class InfinityRerankResponse(cohere.RerankResponse):
    """Infinity's answer on its ``/rerank``: Cohere's envelope, ``document`` a string."""

    results: list[InfinityRerankResult]  # type: ignore[assignment]


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["classify"]
    data: list[list[LabelScore]] = Field(description="Per input: every label, best first.")
    model: str
    usage: Usage
    created: int


class MediaEmbeddings(Translator[MediaEmbeddingsRequest, EmbedRequest]):
    """``/embeddings_image``, ``/embeddings_audio``: OpenAI's answer."""

    def __init__(self, modality: Modality) -> None:
        self.modality = modality

    def count(self, body: MediaEmbeddingsRequest) -> int:
        return len(as_list(body.input))

    def pick(self, body: MediaEmbeddingsRequest) -> Capability:
        return MODALITY_CAPABILITY[self.modality]

    def decode(self, body: MediaEmbeddingsRequest, engine: Engine) -> EmbedRequest:
        check_base64_dtype(engine, body.encoding_format == "base64")
        return EmbedRequest(
            as_list(body.input),
            dimensions=body.dimensions,
            modality=self.modality,
            chunking=long_document_options(body, True)["chunking"],
        )

    def encode(
        self, body: MediaEmbeddingsRequest, engine: Engine, result: Result
    ) -> EmbeddingsResponse:
        return embeddings_body(engine, result, body.encoding_format == "base64")


class Rerank(cohere.Rerank):
    """Infinity's ``/rerank``: Cohere's frame, ``document`` the document string, null
    without ``return_documents`` (Infinity's clients, LiteLLM's ``infinity/``, read a
    string there)."""

    def result(
        self, index: int, score: float, text: str | None, chunk: RerankChunk | None = None
    ) -> Any:
        if chunk is None:
            return of(InfinityRerankResult, index=index, relevance_score=score, document=text)
        return of(
            InfinityRerankResult, index=index, relevance_score=score, document=text, chunk=chunk
        )

    def encode(
        self, body: cohere.RerankRequest, engine: Engine, result: Result
    ) -> InfinityRerankResponse:
        results = self.ranked(body, result)
        return of(
            InfinityRerankResponse,
            object="rerank",
            results=results,
            **cohere.frame(engine.name, result.prompt_tokens),
        )


class Classify(Translator[ClassifyRequest, ClassifyCall]):
    """``/classify``: every label's score per text, in Cohere's frame."""

    capability = "classify"

    def count(self, body: ClassifyRequest) -> int:
        return len(as_list(body.input))

    def decode(self, body: ClassifyRequest, engine: Engine) -> ClassifyCall:
        return classify_request(as_list(body.input), body)

    def encode(self, body: ClassifyRequest, engine: Engine, result: Result) -> ClassifyResponse:
        assert isinstance(result.output, Labels)
        return of(
            ClassifyResponse,
            object="classify",
            data=label_rows(result.output.rows),
            **cohere.frame(engine.name, result.prompt_tokens),
        )


EMBEDDINGS_IMAGE = MediaEmbeddings("image")
EMBEDDINGS_AUDIO = MediaEmbeddings("audio")
RERANK = Rerank()
CLASSIFY = Classify()
