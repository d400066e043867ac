"""OpenAI's ``/v1/embeddings`` (with vLLM's ``truncate_prompt_tokens`` and Infinity's
``modality`` and ``dimensions`` 0): the body as an ``EmbedRequest``, the embeddings as
OpenAI's list, in the shape the model's output has."""

from __future__ import annotations

import time
import uuid
from typing import Any

from ember.api import schemas as s
from ember.api.dialects import Translator, usage
from ember.capabilities import Capability
from ember.engine import Engine, Result
from ember.engine.requests import EmbedRequest
from ember.errors import BadRequest
from ember.heads.quantize import encode_embeddings
from ember.outputs import DenseVectors, MultiVectors, SparseVectors, output_type
from ember.prompts import prompt_for

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


def embeddings_body(engine: Engine, result: Result, base64: bool) -> dict[str, Any]:
    """OpenAI's list of embeddings, in the shape the model's embedding output has: a
    vector per input, a list of vectors (ColBERT), ``{"indices", "values"}`` (SPLADE)."""
    dtype = engine.spec.embedding_dtype
    output = result.output
    vectors: list
    if isinstance(output, SparseVectors):
        vectors = [v.as_dict() for v in output.vectors]
    elif base64 and isinstance(output, DenseVectors | MultiVectors):  # multi: [k, d] flattened
        vectors = output.base64_rows()
    elif dtype != "float32" and isinstance(output, DenseVectors):  # --embedding-dtype
        vectors = encode_embeddings(output.vectors, [dtype])[dtype]
    else:
        vectors = list(result.outputs)
    data = [{"object": "embedding", "embedding": vec, "index": i} for i, vec in enumerate(vectors)]
    return {
        "object": "list",
        "data": data,
        "model": engine.name,
        "usage": usage(result.prompt_tokens),
        "id": str(uuid.uuid4()),  # Infinity's fields, read by its generated client
        "created": int(time.time()),
    }


def _inputs(body: s.EmbeddingsRequest) -> list:
    raw = body.input
    if isinstance(raw, str):
        return [raw]
    if raw and isinstance(raw[0], int):
        return [raw]  # one token-id sequence
    return list(raw)


class Embeddings(Translator[s.EmbeddingsRequest, EmbedRequest]):
    """``POST /v1/embeddings``."""

    def count(self, body: s.EmbeddingsRequest) -> int:
        return len(_inputs(body))

    def pick(self, body: s.EmbeddingsRequest) -> Capability:
        return MODALITY_CAPABILITY[body.modality]

    def decode(self, body: s.EmbeddingsRequest, engine: Engine) -> EmbedRequest:
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
            truncate=body.truncate,
            modality=body.modality,
            # vLLM's meaning: the last k tokens are kept
            truncation_direction="left" if body.truncate_prompt_tokens is not None else "right",
            max_tokens=body.truncate_prompt_tokens,
            **input_type_options(engine, body.input_type),
        )

    def encode(self, body: s.EmbeddingsRequest, engine: Engine, result: Result) -> Any:
        return embeddings_body(engine, result, body.encoding_format == "base64")


EMBEDDINGS = Embeddings()
