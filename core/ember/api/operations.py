"""What each model route does: request body -> engine call -> response body.

Every operation has the same shape, ``(engines, body, limits) -> Reply``, so the
HTTP layer (and the platform adapters' ``/invocations``) run them through one path. A
model route's operation is a dialect's translator (``ember.api.dialects``) wired by
``run``: the dialect decodes and encodes, nothing here knows a body's fields.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ember.api import schemas as s
from ember.api.dialects import Translator
from ember.engine import EngineArray, Timings
from ember.errors import Forbidden, PayloadTooLarge
from ember.models.spec import ResolvedModel
from ember.outputs import is_dense

Operation = Callable[[EngineArray, Any, int], Awaitable["Reply"]]


@dataclass
class Reply:
    body: Any
    timings: Timings


def check_batch(count: int, limit: int, param: str) -> None:
    if count > limit:
        raise PayloadTooLarge(
            f"{count} {param} in one request; --max-client-batch-size allows {limit}",
            param=param,
        )


async def run(translator: Translator, engines: EngineArray, body: Any, limit: int) -> Reply:
    """One model route: the body's inputs held to ``limit``, its model picked, decoded into
    an engine request, run, and the result encoded in the body's dialect."""
    check_batch(translator.count(body), limit, translator.named(body))
    engine = engines.for_task(body.model, translator.pick(body))
    result = await translator.call(engine, translator.decode(body, engine))
    return Reply(translator.encode(body, engine, result), result.timings)


def translated(translator: Translator) -> Operation:
    """``translator`` as a route's operation."""
    return partial(run, translator)


async def tei_tokenize(engines: EngineArray, body: s.TEITokenizeRequest, limit: int) -> Reply:
    texts = [body.inputs] if isinstance(body.inputs, str) else list(body.inputs)
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
