"""Cohere's dialect: embed (``POST /v1/embed``, ``/v2/embed``) as the ``cohere`` SDK speaks
it, and rerank (``/v1/rerank``, ``/v2/rerank``), whose frame Infinity's routes share.

What the SDK (7.x) sends, read from its source: v1 ``Client.embed`` posts ``texts``,
``images``, ``model``, ``input_type``, ``embedding_types``, ``truncate`` (in batches of 96
texts, merged client-side); v2 ``ClientV2.embed`` adds ``inputs``, ``max_tokens``,
``output_dimension`` and ``priority``. Unset arguments are left out, ``None`` is sent as
null, so every optional field here takes null as "default".

What it parses: v1 reads ``response_type`` to pick ``embeddings_floats`` (``embeddings``
a list of float lists, ``texts`` required) or ``embeddings_by_type`` (``embeddings`` an
object keyed by type); v2 always reads the by-type shape. Both read ``id`` and ``meta``
(``api_version.version``, ``billed_units.input_tokens``, summed over v1's batches).

Vectors are always normalised before the output types are computed (the formulas in
``ember.heads.quantize`` assume values in [-1, 1]), so ``float`` here is unit-length even
for a model whose own config does not normalise.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ember.api.dialects import Translator, Usage, of, usage
from ember.api.dialects.long_documents import (
    LongDocumentFields,
    chunk_places,
    long_document_options,
)
from ember.api.dialects.long_rerank import LongRerankFields, RerankChunk, chunk_of
from ember.api.schemas import (
    INSTRUCTION,
    NonEmptyText,
    PositiveInt,
    StrictBool,
    _Body,
    _Part,
)
from ember.capabilities import Capability, Modality
from ember.engine import Engine, Result
from ember.engine.requests import EmbedRequest
from ember.engine.requests import RerankRequest as RerankCall
from ember.errors import BadRequest
from ember.heads.quantize import EmbeddingType, encode_embeddings, to_float
from ember.outputs import ChunkedVectors, DenseVectors, Scores
from ember.prompts import prompt_for

InputType = Literal["search_document", "search_query", "classification", "clustering", "image"]
Truncate = Literal["NONE", "START", "END"]


# Cohere's truncate -> (truncate, which side is cut). START drops the start of the text,
# so the tokenizer keeps the end ("left"); END keeps the start. Cohere's default is END.
TRUNCATION: dict[str, tuple[bool, Literal["left", "right"]]] = {
    "NONE": (False, "right"),
    "START": (True, "left"),
    "END": (True, "right"),
}


def _one_of(*fields: str) -> dict[str, Any]:
    """The schema's rule that the body holds at least one of ``fields``, not null."""
    return {
        "anyOf": [
            {"required": [name], "properties": {name: {"type": "array", "minItems": 1}}}
            for name in fields
        ]
    }


class CohereEmbedRequest(LongDocumentFields):
    """Cohere ``POST /v1/embed``: answers ``embeddings_floats`` unless ``embedding_types``."""

    model_config = ConfigDict(**_Body.model_config, json_schema_extra=_one_of("texts", "images"))

    texts: Annotated[list[NonEmptyText], Field(min_length=1)] | None = Field(
        None, description="The texts to embed."
    )
    images: Annotated[list[NonEmptyText], Field(min_length=1)] | None = Field(
        None,
        description="Images as data: URIs (or http(s) URLs), for an image model (CLIP, "
        "SigLIP, ColPali); instead of `texts`.",
    )
    model: str | None = Field(None, description="Served model name; any name with one model.")
    input_type: InputType | None = Field(
        None,
        description="Picks the model's own prompt where it has one: search_query -> `query`, "
        "search_document -> `document` / `passage` / `corpus`, classification, clustering.",
    )
    embedding_types: Annotated[list[EmbeddingType], Field(min_length=1)] | None = Field(
        None,
        description="Of the normalised vector v, rounding half to even: float; "
        "int8 = round(127 v); uint8 = round(127.5 (v + 1)); ubinary = packbits(v > 0); "
        "binary = ubinary - 128; base64 = v as little-endian float32 bytes. "
        "Absent: v1 answers embeddings_floats, v2 float.",
    )
    truncate: Truncate | None = Field(
        None,
        description="NONE: refuse over-long text (400); START: cut its start; END (default): "
        "cut its end.",
    )
    output_dimension: PositiveInt | None = Field(
        None, description="Matryoshka: keep the first N values, then re-normalise."
    )

    @field_validator("truncate", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _has_input(self) -> CohereEmbedRequest:
        # A body with nothing to embed does not fit the schema (422, like every route's).
        if self.texts is None and not self.images and not getattr(self, "inputs", None):
            raise ValueError("`texts` is required: a non-empty list of strings")
        return self


class CohereEmbedV2Request(CohereEmbedRequest):
    """Cohere ``POST /v2/embed``: always answers ``embeddings_by_type`` (float by default)."""

    model_config = ConfigDict(
        **_Body.model_config, json_schema_extra=_one_of("texts", "images", "inputs")
    )

    inputs: list[Any] | None = Field(
        None, description="Refused: mixed text-and-image content; send `texts` or `images`."
    )
    max_tokens: PositiveInt | None = Field(
        None, description="Accepted when at least the model's max tokens (a no-op)."
    )


class ApiVersion(BaseModel):
    version: str


class BilledUnits(BaseModel):
    input_tokens: int


class EmbedMeta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits


Floats = list[list[float]]
Ints = list[list[int]]


# One vector in each asked type (a chunk's), keyed as ``EmbeddingsByType``.
class EmbeddingVector(BaseModel):
    float: list[float] | None = None
    int8: list[int] | None = None
    uint8: list[int] | None = None
    binary: list[int] | None = None
    ubinary: list[int] | None = None
    base64: str | None = None


# Each field is named as its JSON key (``float`` too): answers are written as built.
class EmbeddingsByType(BaseModel):
    float: Floats | None = None
    int8: Ints | None = None
    uint8: Ints | None = None
    binary: Ints | None = None
    ubinary: Ints | None = None
    base64: list[str] | None = None


class CohereChunk(BaseModel):
    """One chunk of a text (Ember's long-document fields), where it lies in the text."""

    index: int
    embedding: list[float] | EmbeddingVector = Field(
        description="v1 without embedding_types: floats; else keyed by the asked types."
    )
    char_start: int = Field(description="Unicode code points of the text as sent.")
    char_end: int
    token_start: int = Field(description="The text's own tokens (no special tokens, no prompt).")
    token_end: int
    text: str | None = None


class CohereEmbedResponse(BaseModel):
    id: str
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: Floats | EmbeddingsByType = Field(
        description="embeddings_floats: a list of float lists; embeddings_by_type: an "
        "object keyed by the asked `embedding_types`. Chunked: each text's aggregate."
    )
    texts: list[str]
    meta: EmbedMeta
    chunks: list[list[CohereChunk]] | None = Field(
        None, description="With chunking or overflow chunk: per text, its chunks."
    )


def embed_response(
    vectors: np.ndarray,
    texts: list[str],
    input_tokens: int,
    *,
    embedding_types: list[str] | None,
    api_version: str,
    chunks: list[list[CohereChunk]] | None = None,
) -> CohereEmbedResponse:
    """Cohere's answer. ``embedding_types=None`` gives v1's ``embeddings_floats`` shape;
    ``chunks``, each text's, when it was chunked."""
    embeddings: list | EmbeddingsByType
    if embedding_types is None:
        response_type, embeddings = "embeddings_floats", list(to_float(vectors))
    else:
        response_type = "embeddings_by_type"
        embeddings = of(EmbeddingsByType, **encode_embeddings(vectors, embedding_types))
    meta = of(
        EmbedMeta,
        api_version=of(ApiVersion, version=api_version),
        billed_units=of(BilledUnits, input_tokens=input_tokens),
    )
    extra = {} if chunks is None else {"chunks": chunks}
    return of(
        CohereEmbedResponse,
        id=str(uuid.uuid4()),
        response_type=response_type,
        embeddings=embeddings,
        texts=texts,
        meta=meta,
        **extra,
    )


def _items(body: CohereEmbedRequest) -> tuple[list[str], Modality]:
    """The texts or images to embed, or a 400 naming what this server cannot do."""
    if getattr(body, "inputs", None):
        raise BadRequest(
            "`inputs` (content mixing text and images in one embedding) is not supported; "
            "send `texts` or `images`",
            param="inputs",
        )
    if body.images:
        if body.texts:
            raise BadRequest("send `texts` or `images`, not both", param="images")
        return body.images, "image"
    if body.input_type == "image":
        raise BadRequest("input_type 'image' needs `images`", param="input_type")
    if not body.texts:  # the schema already refuses this; kept for direct callers
        raise BadRequest("`texts` is required: a non-empty list of strings", param="texts")
    return body.texts, "text"


class Embed(Translator[CohereEmbedRequest, EmbedRequest]):
    """``POST /v1/embed`` and ``/v2/embed``: normalised dense vectors (Cohere's types are
    of one vector per text), Cohere's truncation and ``input_type``."""

    def count(self, body: CohereEmbedRequest) -> int:
        return len(_items(body)[0])

    def named(self, body: CohereEmbedRequest) -> str:
        return "texts" if _items(body)[1] == "text" else "images"

    def pick(self, body: CohereEmbedRequest) -> Capability:
        return "embed" if _items(body)[1] == "text" else "image_embed"

    def decode(self, body: CohereEmbedRequest, engine: Engine) -> EmbedRequest:
        items, modality = _items(body)
        model = engine.model
        if model is not None:  # before any download: the model must take images
            engine.family.require_modality(modality, engine.name, param="images")
        max_tokens = getattr(body, "max_tokens", None)
        if model is not None and max_tokens is not None and max_tokens < model.max_length:
            raise BadRequest(
                f"max_tokens below the model's maximum ({model.max_length}) is not supported; "
                "leave it out to embed up to the maximum",
                param="max_tokens",
            )
        common: dict[str, Any] = {
            "output": DenseVectors.kind,
            "normalize": True,
            "dimensions": body.output_dimension,
            "dimensions_param": "output_dimension",
            "modality": modality,
        }
        if modality != "text":
            return EmbedRequest(items, **common)
        truncate, direction = TRUNCATION[body.truncate or "END"]
        prompts = model.prompts if model is not None else {}
        options = long_document_options(body, truncate)
        chunking = options["chunking"]
        if chunking is not None and chunking.aggregate == "none" and not chunking.given:
            raise BadRequest(
                "Cohere's answer holds one embedding per text: aggregate 'none' is for "
                "/v1/embeddings (its `embedding` may be null)",
                param="aggregate",
            )
        return EmbedRequest(
            items,
            truncation_direction=direction,
            prompt_name=prompt_for(body.input_type, prompts),
            **options,
            **common,
        )

    def encode(
        self, body: CohereEmbedRequest, engine: Engine, result: Result
    ) -> CohereEmbedResponse:
        v2 = isinstance(body, CohereEmbedV2Request)
        texts = body.texts if body.texts and not body.images else []
        types = body.embedding_types or (["float"] if v2 else None)
        chunked = result.output if isinstance(result.output, ChunkedVectors) else None
        return embed_response(
            result.outputs,
            texts,
            result.prompt_tokens,
            embedding_types=types,
            api_version="2" if v2 else "1",
            chunks=cohere_chunks(chunked, types) if chunked is not None else None,
        )


def cohere_chunks(output: ChunkedVectors, types: list[str] | None) -> list[list[CohereChunk]]:
    """Each text's chunks, their vectors as the body's ``embedding_types`` ask."""
    out = []
    for i, vectors in enumerate(output.chunks):
        by_type = encode_embeddings(vectors, types) if types is not None else None
        out.append(
            [
                of(
                    CohereChunk,
                    embedding=to_float(vectors[k : k + 1])[0]
                    if by_type is None
                    else of(EmbeddingVector, **{t: rows[k] for t, rows in by_type.items()}),
                    **fields,
                )
                for k, fields in enumerate(chunk_places(output, i))
            ]
        )
    return out


class RerankDocument(_Part):
    text: NonEmptyText


class RerankRequest(LongRerankFields):
    """Cohere's ``POST /v1/rerank`` and ``/v2/rerank`` body, and Infinity's ``/rerank``."""

    query: NonEmptyText
    documents: Annotated[list[NonEmptyText | RerankDocument], Field(min_length=1)]
    model: str | None = None
    top_n: PositiveInt | None = Field(None, description="Return only the best N.")
    return_documents: StrictBool = False
    raw_scores: StrictBool = Field(False, description="Logits instead of sigmoid scores.")
    truncate: StrictBool = True
    instruction: NonEmptyText | None = Field(None, description=INSTRUCTION)
    modality: Literal["text", "image"] = Field(
        "text",
        description="What `documents` hold: image for page images (URLs or data: URIs) "
        "scored by MaxSim against the text query (ColPali, ColQwen2).",
    )


class RerankDocumentOut(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocumentOut | None = Field(None, description="With `return_documents`.")
    chunk: RerankChunk | None = Field(
        None, description="With `max_tokens_per_doc` / `max_chunks_per_doc`: the best chunk."
    )


class RerankResponse(BaseModel):
    id: str
    object: Literal["rerank"]
    results: list[RerankResult]
    model: str
    usage: Usage
    created: int


def frame(model: str, tokens: int) -> dict[str, Any]:
    """The fields of the frame Cohere's and Infinity's clients read around rerank and
    classify results, besides ``object`` and the results."""
    return {
        "id": str(uuid.uuid4()),
        "model": model,
        "usage": usage(tokens),
        "created": int(time.time()),
    }


def documents(body: RerankRequest) -> list[str]:
    return [d if isinstance(d, str) else d.text for d in body.documents]


class Rerank(Translator[RerankRequest, RerankCall]):
    """Cohere's ``/v1/rerank``, ``/v2/rerank``: the best ``top_n`` documents first;
    ``document`` is ``{"text": ...}``, there only with ``return_documents``, as the Cohere
    SDKs read it."""

    capability = "rerank"
    field = "documents"

    def count(self, body: RerankRequest) -> int:
        return len(body.documents)

    def decode(self, body: RerankRequest, engine: Engine) -> RerankCall:
        return RerankCall(
            body.query,
            documents(body),
            raw_scores=body.raw_scores,
            truncate=body.truncate,
            modality=body.modality,
            instruction=body.instruction,
            scale="probability",
            **body.chunking(),
        )

    def result(
        self, index: int, score: float, text: str | None, chunk: RerankChunk | None = None
    ) -> Any:
        """One result; its document's text there only when asked for (``text`` not None),
        its best chunk only when the documents were chunked."""
        fields: dict[str, Any] = {"index": index, "relevance_score": score}
        if text is not None:
            fields["document"] = of(RerankDocumentOut, text=text)
        if chunk is not None:
            fields["chunk"] = chunk
        return of(RerankResult, **fields)

    def ranked(self, body: RerankRequest, result: Result) -> list[Any]:
        """The best ``top_n`` results, best first."""
        assert isinstance(result.output, Scores)
        scores: Sequence[float] = result.output.values
        docs = documents(body) if body.return_documents else None
        return [
            self.result(
                int(i),
                float(scores[i]),
                docs[i] if docs is not None else None,
                chunk_of(result.output, int(i)),
            )
            for i in result.output.best_first(body.top_n)
        ]

    def encode(self, body: RerankRequest, engine: Engine, result: Result) -> RerankResponse:
        results = self.ranked(body, result)
        return of(
            RerankResponse,
            object="rerank",
            results=results,
            **frame(engine.name, result.prompt_tokens),
        )


EMBED = Embed()
RERANK = Rerank()
