"""What each model route does: request body -> engine call -> response body.

Every operation has the same shape, ``(engines, body, limits) -> Reply``, so the
HTTP layer (and the platform adapters' ``/invocations``) run them through one path.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ember.api import schemas as s
from ember.capabilities import Capability, Modality
from ember.engine import Engine, EngineArray, Result, Timings
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest, full_size
from ember.errors import BadRequest, Forbidden, PayloadTooLarge
from ember.heads.quantize import encode_embeddings
from ember.models.spec import ResolvedModel
from ember.outputs import (
    DenseVectors,
    MultiVectors,
    OutputValue,
    Scores,
    SparseVectors,
    is_dense,
    output_type,
)
from ember.prompts import prompt_for

# Which capability a request's modality needs, to pick a model when none is named.
MODALITY_CAPABILITY: dict[str, Capability] = {
    "text": "embed",
    "image": "image_embed",
    "audio": "audio_embed",
}


@dataclass
class Reply:
    body: Any
    timings: Timings


def _as_list(value: Any) -> list:
    return [value] if isinstance(value, str) else list(value)


def check_batch(count: int, limit: int, param: str) -> None:
    if count > limit:
        raise PayloadTooLarge(
            f"{count} {param} in one request; --max-client-batch-size allows {limit}",
            param=param,
        )


def _usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _envelope(kind: str, key: str, payload: Any, model: str, tokens: int) -> dict[str, Any]:
    """The response frame Cohere/Infinity clients expect around rerank and classify results."""
    return {
        "id": str(uuid.uuid4()),
        "object": kind,
        key: payload,
        "model": model,
        "usage": _usage(tokens),
        "created": int(time.time()),
    }


def input_type_options(engine: Engine, input_type: str | None) -> dict[str, Any]:
    """Cohere's ``input_type`` as engine options: query-side encoding, and the model's
    own prompt for it where it has one."""
    if input_type is None:
        return {}
    prompts = engine.model.prompts if engine.model is not None else {}
    return {  # the side: query, document, or neither (a Router's default route)
        "query": {"search_query": True, "search_document": False}.get(input_type),
        "prompt_name": prompt_for(input_type, prompts),
    }


def decode_tei(
    texts: list,
    body: s.TEIEmbedOutputRequest | Any,
    output: type[OutputValue],
    **fields: Any,
) -> EmbedRequest:
    """A TEI body's text fields (``truncate``, ``truncation_direction`` in either case,
    ``prompt_name``) as an engine request for ``output``, with the route's own ``fields``."""
    return EmbedRequest(
        texts,
        output=output.kind,
        truncate=body.truncate,
        truncation_direction=body.truncation_direction.lower(),
        prompt_name=body.prompt_name,
        **fields,
    )


def decode_openai_embeddings(
    engine: Engine, body: s.EmbeddingsRequest, inputs: list
) -> EmbedRequest:
    """OpenAI's (and vLLM's, Infinity's) /v1/embeddings body as an engine request,
    refusing the field combinations no model can take."""
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
    _check_base64_dtype(engine, base64)
    if body.truncate_prompt_tokens is not None and not body.truncate:
        raise BadRequest(
            "truncate_prompt_tokens cuts inputs and truncate=false refuses to: send one",
            param="truncate_prompt_tokens",
        )
    return EmbedRequest(
        inputs,
        dimensions=full_size(body.dimensions),
        truncate=body.truncate,
        modality=body.modality,
        # vLLM's meaning: the last k tokens are kept
        truncation_direction="left" if body.truncate_prompt_tokens is not None else "right",
        max_tokens=body.truncate_prompt_tokens,
        **input_type_options(engine, body.input_type),
    )


async def openai_embeddings(engines: EngineArray, body: s.EmbeddingsRequest, limit: int) -> Reply:
    """Dense vectors, or what the model returns: a list of vectors per input (ColBERT),
    ``{"indices", "values"}`` per input (SPLADE)."""
    raw = body.input
    if isinstance(raw, str):
        inputs: list = [raw]
    elif raw and isinstance(raw[0], int):
        inputs = [raw]  # one token-id sequence
    else:
        inputs = list(raw)
    check_batch(len(inputs), limit, "input")
    engine = engines.for_task(body.model, MODALITY_CAPABILITY[body.modality])
    result = await engine.embed(decode_openai_embeddings(engine, body, inputs))
    return _embeddings_reply(engine, result, body.encoding_format == "base64")


async def media_embeddings(
    engines: EngineArray, body: s.MediaEmbeddingsRequest, limit: int, modality: Modality
) -> Reply:
    """Infinity's legacy ``/embeddings_image`` and ``/embeddings_audio``: /v1/embeddings
    with the modality in the path."""
    inputs = _as_list(body.input)
    check_batch(len(inputs), limit, "input")
    engine = engines.for_task(body.model, MODALITY_CAPABILITY[modality])
    _check_base64_dtype(engine, body.encoding_format == "base64")
    request = EmbedRequest(inputs, dimensions=full_size(body.dimensions), modality=modality)
    result = await engine.embed(request)
    return _embeddings_reply(engine, result, body.encoding_format == "base64")


async def embeddings_image(
    engines: EngineArray, body: s.MediaEmbeddingsRequest, limit: int
) -> Reply:
    return await media_embeddings(engines, body, limit, "image")


async def embeddings_audio(
    engines: EngineArray, body: s.MediaEmbeddingsRequest, limit: int
) -> Reply:
    return await media_embeddings(engines, body, limit, "audio")


def _check_base64_dtype(engine: Engine, base64: bool) -> None:
    """base64 is float32 bytes; a model served with --embedding-dtype answers other types."""
    dtype = engine.spec.embedding_dtype
    if base64 and dtype != "float32":
        raise BadRequest(
            f"encoding_format base64 sends float32 bytes; model {engine.name!r} answers "
            f"{dtype} vectors (--embedding-dtype): send float",
            param="encoding_format",
        )


def _embeddings_reply(engine: Engine, result: Result, base64: bool) -> Reply:
    """OpenAI's list of embeddings, in the shape the model's embedding output has."""
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
    return Reply(
        {
            "object": "list",
            "data": data,
            "model": engine.name,
            "usage": _usage(result.prompt_tokens),
            "id": str(uuid.uuid4()),  # Infinity's fields, read by its generated client
            "created": int(time.time()),
        },
        result.timings,
    )


async def tei_embed(engines: EngineArray, body: s.TEIEmbedRequest, limit: int) -> Reply:
    texts = _as_list(body.inputs)
    check_batch(len(texts), limit, "inputs")
    engine = engines.for_task(body.model, "embed")
    request = decode_tei(
        texts, body, DenseVectors, normalize=body.normalize, dimensions=full_size(body.dimensions)
    )
    result = await engine.embed(request)
    return Reply(result.outputs, result.timings)


async def _tei_output(
    engines: EngineArray,
    body: s.TEIEmbedOutputRequest,
    limit: int,
    output: type[OutputValue],
) -> Result:
    texts = _as_list(body.inputs)
    check_batch(len(texts), limit, "inputs")
    engine = engines.for_task(body.model, output.capability)
    return await engine.embed(decode_tei(texts, body, output))


async def tei_embed_sparse(
    engines: EngineArray, body: s.TEIEmbedOutputRequest, limit: int
) -> Reply:
    """TEI's shape: per input, ``[{"index", "value"}]`` sorted by index, zeros dropped."""
    result = await _tei_output(engines, body, limit, SparseVectors)
    body_out = [
        [{"index": int(i), "value": float(v)} for i, v in zip(vec.indices, vec.values, strict=True)]
        for vec in result.outputs
    ]
    return Reply(body_out, result.timings)


async def tei_embed_all(engines: EngineArray, body: s.TEIEmbedOutputRequest, limit: int) -> Reply:
    """TEI's shape: per input, one vector per token (``[[[float]]]``)."""
    result = await _tei_output(engines, body, limit, MultiVectors)
    return Reply(result.outputs, result.timings)


def best_first(result: Result, top_n: int | None) -> np.ndarray:
    """A rerank's indices by descending score (ties keep input order), cut to ``top_n``."""
    assert isinstance(result.output, Scores)
    return result.output.best_first(top_n)


async def cohere_rerank(engines: EngineArray, body: s.RerankRequest, limit: int) -> Reply:
    """Cohere's answer (``/v1/rerank``, ``/v2/rerank``): ``document`` is ``{"text": ...}``,
    there only with ``return_documents``, as the Cohere SDKs read it."""
    return await _rerank(engines, body, limit, cohere_document)


async def infinity_rerank(engines: EngineArray, body: s.RerankRequest, limit: int) -> Reply:
    """Infinity's answer on its ``/rerank``: ``document`` is the document string, null
    without ``return_documents`` (Infinity's clients, LiteLLM's ``infinity/``, read a
    string there)."""
    return await _rerank(engines, body, limit, infinity_document)


def cohere_document(text: str | None) -> dict[str, Any]:
    return {} if text is None else {"document": {"text": text}}


def infinity_document(text: str | None) -> dict[str, Any]:
    return {"document": text}


async def _rerank(
    engines: EngineArray,
    body: s.RerankRequest,
    limit: int,
    document: Callable[[str | None], dict[str, Any]],
) -> Reply:
    """The best ``top_n`` documents first; ``document`` says how a result carries its text."""
    docs = [d if isinstance(d, str) else d.text for d in body.documents]
    check_batch(len(docs), limit, "documents")
    engine = engines.for_task(body.model, "rerank")
    request = RerankRequest(
        body.query,
        docs,
        raw_scores=body.raw_scores,
        truncate=body.truncate,
        modality=body.modality,
        instruction=body.instruction,
        scale="probability",
    )
    result = await engine.rerank(request)
    results = [
        {
            "index": int(i),
            "relevance_score": float(result.outputs[i]),
            **document(docs[i] if body.return_documents else None),
        }
        for i in best_first(result, body.top_n)
    ]
    return Reply(
        _envelope("rerank", "results", results, engine.name, result.prompt_tokens), result.timings
    )


async def tei_rerank(engines: EngineArray, body: s.TEIRerankRequest, limit: int) -> Reply:
    check_batch(len(body.texts), limit, "texts")
    engine = engines.for_task(body.model, "rerank")
    request = RerankRequest(
        body.query,
        body.texts,
        raw_scores=body.raw_scores,
        truncate=body.truncate,
        instruction=body.instruction,
        scale="probability",
    )
    result = await engine.rerank(request)
    ranked = []
    for i in best_first(result, body.top_n):
        item: dict[str, Any] = {"index": int(i), "score": float(result.outputs[i])}
        if body.return_text:
            item["text"] = body.texts[i]
        ranked.append(item)
    return Reply(ranked, result.timings)


async def classify(engines: EngineArray, body: s.ClassifyRequest, limit: int) -> Reply:
    texts = _as_list(body.input)
    check_batch(len(texts), limit, "input")
    engine = engines.for_task(body.model, "classify")
    request = ClassifyRequest(texts, raw_scores=body.raw_scores, truncate=body.truncate)
    labels, result = await engine.classify(request)
    return Reply(
        _envelope("classify", "data", labels, engine.name, result.prompt_tokens), result.timings
    )


async def tei_predict(engines: EngineArray, body: s.TEIPredictRequest, limit: int) -> Reply:
    texts = _as_list(body.inputs)
    check_batch(len(texts), limit, "inputs")
    engine = engines.for_task(body.model, "classify")
    request = ClassifyRequest(texts, raw_scores=body.raw_scores, truncate=body.truncate)
    labels, result = await engine.classify(request)
    return Reply(labels[0] if isinstance(body.inputs, str) else labels, result.timings)


async def tei_tokenize(engines: EngineArray, body: s.TEITokenizeRequest, limit: int) -> Reply:
    texts = _as_list(body.inputs)
    check_batch(len(texts), limit, "inputs")
    engine = engines.get(body.model)
    if body.prompt_name and engine.text_inputs is not None:
        texts = engine.text_inputs.with_prompt(texts, body.prompt_name)
    tokens = await engine.tokenize(texts, add_special_tokens=body.add_special_tokens)
    return Reply(tokens, Timings())


def dense_dimensions(model: ResolvedModel) -> int | None:
    """The width of a dense embedding as served (after the model's Dense layers)."""
    return model.hidden_size if is_dense(model.family.embedding) else None


def models_list(engines: EngineArray) -> dict[str, Any]:
    """OpenAI's (and Infinity's) model list: the models the request's API key may use."""
    data = []
    for engine in engines.visible():
        entry: dict[str, Any] = {
            "id": engine.name,
            "object": "model",
            "owned_by": "infinity",  # the one value Infinity's generated client accepts
            "created": 0,
            "ready": engine.ready,
        }
        batcher = engine.batcher  # Infinity's `stats`, which its client requires
        depth = batcher.depth if batcher is not None else 0
        entry["stats"] = {
            "queue_fraction": depth / engine.spec.max_queue_size,
            "queue_absolute": depth,
            "batch_size": batcher.max_batch_size if batcher else engine.spec.max_batch_size,
        }
        if engine.model is not None and engine.backend is not None:
            entry.update(
                task=engine.model.task,
                kind=engine.family.name,
                capabilities=engine.family.capabilities,
                backend=engine.backend.info.name,
                device=engine.backend.info.device,
                dtype=engine.backend.info.dtype,
                backend_details=engine.backend.info.details,
                max_input_length=engine.processor.max_length if engine.processor else None,
                dimensions=dense_dimensions(engine.model),
            )
            entry["max_model_len"] = entry["max_input_length"]  # vLLM's (and mteb's) name
        data.append(entry)
    return {"object": "list", "data": data}


def tei_info(engines: EngineArray, version: str, max_client_batch_size: int) -> dict[str, Any]:
    """TEI's /info for the first model the request's API key may use; ``models`` lists
    every served one it may use. Forbidden for a key that may use none."""
    visible = engines.visible()
    if not visible:
        raise Forbidden("this API key may use none of the served models", param="model")
    first = visible[0]
    info: dict[str, Any] = {
        "model_id": first.name,
        "version": version,
        "models": [engine.name for engine in visible],
        "max_client_batch_size": max_client_batch_size,
    }
    if first.model is None or first.backend is None or first.processor is None:
        return info
    m = first.model
    if m.task == "embed":
        pooling = "+".join(m.poolings) if is_dense(first.family.embedding) else first.family.name
        model_type: dict[str, Any] = {"embedding": {"pooling": pooling}}
    else:
        kind = "reranker" if m.task == "rerank" else "classifier"
        labels = {str(k): v for k, v in m.id2label.items()}
        model_type = {
            kind: {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}
        }
    info.update(
        model_sha=None,
        model_dtype=first.backend.info.dtype,
        model_type=model_type,
        backend=first.backend.info.name,
        backend_details=first.backend.info.details,  # /v1/models' too: what auto chose, why
        device=first.backend.info.device,
        max_input_length=first.processor.max_length,
        dimensions=dense_dimensions(m),
        max_batch_tokens=first.spec.max_batch_tokens,
        max_batch_requests=first.spec.max_batch_size,
        max_concurrent_requests=first.spec.max_queue_size,
    )
    return info
