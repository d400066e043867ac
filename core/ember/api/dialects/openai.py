"""OpenAI's dialect: ``/v1/embeddings`` (with vLLM's ``truncate_prompt_tokens`` and
Infinity's ``modality`` and ``dimensions`` 0), the body as an ``EmbedRequest``, the
embeddings as OpenAI's list in the shape the model's output has; and ``/v1/models``."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from ember.api.dialects import Translator, Usage, of, usage
from ember.api.dialects.long_documents import (
    ChunkItem,
    LongDocumentFields,
    chunk_items,
    document_vectors,
    long_document_options,
)
from ember.api.schemas import (
    InputType,
    Modality,
    NonEmptyText,
    StrictBool,
    StrictInt,
    TokenIds,
)
from ember.capabilities import Capability
from ember.engine import Engine, EngineArray, Result
from ember.engine.requests import EmbedRequest
from ember.errors import BadRequest
from ember.heads.quantize import encode_embeddings
from ember.lanes import SERVED_TIER
from ember.lanes import current as current_lane
from ember.models.spec import ResolvedModel
from ember.outputs import (
    ChunkedVectors,
    DenseVectors,
    MultiVectors,
    SparseVectors,
    is_dense,
    output_type,
)
from ember.prompts import prompt_for


class EmbeddingsRequest(LongDocumentFields):
    """OpenAI ``POST /v1/embeddings`` (Ember's long-document fields: ``extra_body``)."""

    input: (
        NonEmptyText
        | Annotated[list[NonEmptyText], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    ) = Field(
        description="A string, a list of strings, token ids, or a list of token-id lists.",
        # The members take disjoint JSON, so the first that fits is the answer; pydantic's
        # default "smart" mode tries every member: 9.7 against 2.8 us for 32 strings.
        union_mode="left_to_right",
    )
    model: str | None = Field(None, description="Served model name; any name with one model.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: little-endian float32 bytes."
    )
    dimensions: StrictInt | None = Field(
        None,
        description="Matryoshka: keep the first N values, then re-normalise; 0 or null: all "
        "(Infinity's client sends 0).",
    )
    user: str | None = None
    modality: Modality = Field(
        "text",
        description="Infinity's field: what `input` holds. image or audio: each item is an "
        "http(s) URL or a data: URI with base64 content, for a model that takes them.",
    )
    truncate: StrictBool = Field(
        True, description="Cut text past the model's max tokens (else 400)."
    )
    input_type: InputType | None = Field(
        None,
        description="Cohere's field: search_query encodes queries (ColBERT markers and "
        "expansion, the model's query prompt); default: documents.",
    )
    truncate_prompt_tokens: StrictInt | None = Field(
        None,
        description="vLLM's field: keep each input's last k tokens (left truncation), the "
        "model's special tokens counted and kept; -1: the model's max length; past it, 400.",
    )


class SparseEmbedding(BaseModel):
    indices: list[int]
    values: list[float]


class EmbeddingItem(BaseModel):
    object: Literal["embedding"]
    embedding: list[float] | list[list[float]] | SparseEmbedding | str | None = Field(
        description="Dense: [float]; ColBERT: one vector per kept token; SPLADE: indices "
        "and values; base64: little-endian float32 bytes. Chunked: the chunks' aggregate "
        "(null with aggregate none)."
    )
    index: int
    chunks: list[ChunkItem] | None = Field(
        None, description="With chunking or overflow chunk: each chunk, where it lies."
    )


class EmbeddingsResponse(BaseModel):
    object: Literal["list"]
    data: list[EmbeddingItem]
    model: str
    usage: Usage
    id: str = Field(description="Infinity's: unique per answer.")
    created: int = Field(description="Infinity's: Unix seconds.")
    service_tier: Literal["priority", "default", "flex"] = Field(
        description="OpenAI's: the tier (priority lane) the request was served in."
    )


# Which capability a request's modality needs, to pick a model when none is named.
MODALITY_CAPABILITY: dict[str, Capability] = {
    "text": "embed",
    "image": "image_embed",
    "audio": "audio_embed",
}


def input_type_options(engine: Engine, input_type: str | None) -> dict[str, Any]:
    """Cohere's ``input_type`` as request fields: query-side encoding, and the model's own
    prompt for it where it has one."""
    if input_type is None:
        return {}
    prompts = engine.model.prompts if engine.model is not None else {}
    return {  # the side: query, document, or neither (a Router's default route)
        "query": {"search_query": True, "search_document": False}.get(input_type),
        "prompt_name": prompt_for(input_type, prompts),
    }


def check_base64_dtype(engine: Engine, base64: bool) -> None:
    """base64 is float32 bytes; a model served with --embedding-dtype answers other types."""
    dtype = engine.spec.embedding_dtype
    if base64 and dtype != "float32":
        raise BadRequest(
            f"encoding_format base64 sends float32 bytes; model {engine.name!r} answers "
            f"{dtype} vectors (--embedding-dtype): send float",
            param="encoding_format",
        )


def embeddings_body(engine: Engine, result: Result, base64: bool) -> EmbeddingsResponse:
    """OpenAI's list of embeddings, in the shape the model's embedding output has: a
    vector per input, a list of vectors (ColBERT), ``{"indices", "values"}`` (SPLADE)."""
    dtype = engine.spec.embedding_dtype
    output = result.output
    vectors: list
    if isinstance(output, ChunkedVectors):
        data = [
            of(
                EmbeddingItem,
                object="embedding",
                embedding=vector,
                index=i,
                chunks=chunk_items(output, i, base64),
            )
            for i, vector in enumerate(document_vectors(output, base64))
        ]
    else:
        if isinstance(output, SparseVectors):
            vectors = [of(SparseEmbedding, **v.as_dict()) for v in output.vectors]
        elif base64 and isinstance(output, DenseVectors | MultiVectors):  # multi: [k, d]
            vectors = output.base64_rows()
        elif dtype != "float32" and isinstance(output, DenseVectors):  # --embedding-dtype
            vectors = encode_embeddings(output.vectors, [dtype])[dtype]
        else:
            vectors = list(result.outputs)
        data = [
            of(EmbeddingItem, object="embedding", embedding=vec, index=i)
            for i, vec in enumerate(vectors)
        ]
    return of(
        EmbeddingsResponse,
        object="list",
        data=data,
        model=engine.name,
        usage=usage(result.prompt_tokens),
        id=str(uuid.uuid4()),  # Infinity's fields, read by its generated client
        created=int(time.time()),
        service_tier=SERVED_TIER[current_lane()],
    )


def _inputs(body: EmbeddingsRequest) -> list:
    raw = body.input
    if isinstance(raw, str):
        return [raw]
    if raw and isinstance(raw[0], int):
        return [raw]  # one token-id sequence
    return list(raw)


class Embeddings(Translator[EmbeddingsRequest, EmbedRequest]):
    """``POST /v1/embeddings``."""

    def count(self, body: EmbeddingsRequest) -> int:
        return len(_inputs(body))

    def pick(self, body: EmbeddingsRequest) -> Capability:
        return MODALITY_CAPABILITY[body.modality]

    def decode(self, body: EmbeddingsRequest, engine: Engine) -> EmbedRequest:
        """Refuses the field combinations no model can take."""
        inputs = _inputs(body)
        if body.modality != "text" and not all(isinstance(item, str) for item in inputs):
            raise BadRequest(
                f"modality {body.modality}: `input` holds URLs or data: URIs, not token ids",
                param="input",
            )
        base64 = body.encoding_format == "base64"
        embedding = engine.family.embedding if engine.model is not None else None
        if base64 and embedding is not None and not output_type(embedding).base64:
            raise BadRequest(
                f"encoding_format base64 is for dense and multi-vector embeddings; model "
                f"{engine.name!r} returns sparse ones (indices and values): send float",
                param="encoding_format",
            )
        check_base64_dtype(engine, base64)
        if body.truncate_prompt_tokens is not None and not body.truncate:
            raise BadRequest(
                "truncate_prompt_tokens cuts inputs and truncate=false refuses to: send one",
                param="truncate_prompt_tokens",
            )
        return EmbedRequest(
            inputs,
            dimensions=body.dimensions,
            modality=body.modality,
            # vLLM's meaning: the last k tokens are kept
            truncation_direction="left" if body.truncate_prompt_tokens is not None else "right",
            max_tokens=body.truncate_prompt_tokens,
            **input_type_options(engine, body.input_type),
            **long_document_options(body, body.truncate),
        )

    def encode(self, body: EmbeddingsRequest, engine: Engine, result: Result) -> EmbeddingsResponse:
        return embeddings_body(engine, result, body.encoding_format == "base64")


EMBEDDINGS = Embeddings()


# GET /v1/models


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
    status: Literal["loaded", "loading", "unloaded", "failed"] = Field(
        description="Models on demand: whether it is in memory now (llama.cpp's states)."
    )
    memory_bytes: int = Field(
        description="Memory attributed to the model while loaded (resident, with device "
        "memory; measured around its load); 0 when not."
    )
    last_used: float | None = Field(
        description="Unix time a request last used it; null: none since start."
    )
    pinned: bool = Field(description="Never unloaded (every --model-id model is).")
    load_seconds: float | None = Field(description="Its last load's seconds; null: never loaded.")
    error: str | None = Field(None, description="Why its last load failed (status failed).")
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


def dense_dimensions(model: ResolvedModel) -> int | None:
    """The width of a dense embedding as served (after the model's Dense layers)."""
    return model.hidden_size if is_dense(model.family.embedding) else None


def models_list(engines: EngineArray) -> ModelsResponse:
    """OpenAI's (and Infinity's) model list: the models the request's API key may use."""
    data = []
    for engine in engines.visible():
        batcher = engine.batcher  # Infinity's `stats`, which its client requires
        depth = batcher.depth if batcher is not None else 0
        stats = ModelStats(
            queue_fraction=depth / engine.spec.max_queue_size,
            queue_absolute=depth,
            batch_size=batcher.max_batch_size if batcher else engine.spec.max_batch_size,
        )
        facts: dict[str, Any] = {}
        if engine.model is not None and engine.backend is not None:
            length = engine.processor.max_length if engine.processor else None
            facts = dict(
                task=engine.model.task,
                kind=engine.family.name,
                capabilities=engine.family.capabilities,
                backend=engine.backend.info.name,
                device=engine.backend.info.device,
                dtype=engine.backend.info.dtype,
                backend_details=engine.backend.info.details,
                max_input_length=length,
                dimensions=dense_dimensions(engine.model),
                max_model_len=length,  # vLLM's (and mteb's) name
            )
        slot = engines.residency.slot(engine)
        if slot.error is not None and slot.status == "failed":
            facts["error"] = slot.error
        card = ModelCard(
            id=engine.name,
            object="model",
            owned_by="infinity",  # the one value Infinity's generated client accepts
            created=0,
            ready=engine.ready,
            stats=stats,
            status=slot.status,
            memory_bytes=slot.memory_bytes,
            last_used=slot.last_used,
            pinned=slot.pinned,
            load_seconds=slot.load_seconds,
            **facts,
        )
        data.append(card)
    return ModelsResponse(object="list", data=data)
