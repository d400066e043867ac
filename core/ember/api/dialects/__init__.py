"""Each API dialect as a translator: ``decode(body) -> engine request`` and
``encode(result) -> answer``.

One module per dialect (``openai``, ``cohere``, ``tei``, ``infinity``, ``vllm``,
``sagemaker``) holds its request bodies, its response models and what they mean, one
``Translator`` per operation. ``encode`` returns a response model, built with ``of`` (no
validation) and written by ``dumps`` (orjson, numpy arrays as they are); its return
annotation is what the OpenAPI schema documents for the route. The route
table wires each through ``ember.api.operations.run``: count the inputs against
--max-client-batch-size, pick the model, decode, call the engine, encode. What every
dialect shares — ``dimensions`` 0 as the full size, the Matryoshka range, the model's
checks — is decided once, in the request (``ember.engine.requests``), not here.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

import orjson
from pydantic import BaseModel

from ember.capabilities import Capability
from ember.engine import Engine, Result
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest

B = TypeVar("B")  # the dialect's body
Q = TypeVar("Q")  # the engine request it decodes to
M = TypeVar("M", bound=BaseModel)

_set = object.__setattr__


def of(model: type[M], /, **fields: Any) -> M:
    """``model`` holding ``fields`` as given: what a translator answers, typed where it is
    made, with no validation. Validating an OpenAI answer of 32 x 384 floats costs more
    than serialising it, and ``model_construct`` (defaults, per field) 3 us an item; this
    is under 1. Fields left out stay out of the answer (``dumps``), as the clients expect
    (Cohere's ``document`` without ``return_documents``); values may be numpy arrays
    where the model says lists (orjson writes them)."""
    answer = model.__new__(model)
    _set(answer, "__dict__", fields)
    _set(answer, "__pydantic_fields_set__", set(fields))
    _set(answer, "__pydantic_extra__", None)
    _set(answer, "__pydantic_private__", None)
    return answer


def _plain(value: Any) -> Any:
    """orjson's hook for what it cannot write itself: a response model, as its fields
    (read off the class, not ``isinstance``: pydantic's metaclass makes that 4x slower)."""
    try:
        fields = value.__dict__
        root = value.__pydantic_root_model__
    except AttributeError:
        raise TypeError(f"{type(value).__name__} is not JSON") from None
    return fields["root"] if root else fields


def dumps(answer: Any) -> bytes:
    """An answer's JSON bytes: its models as their fields, numpy arrays as orjson writes
    them (no copy to lists)."""
    return orjson.dumps(answer, default=_plain, option=orjson.OPT_SERIALIZE_NUMPY)


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class LabelScore(BaseModel):  # TEI's /predict, Infinity's /classify
    label: str
    score: float


class Translator(Generic[B, Q]):
    """One operation of one dialect. ``capability`` is what a model must do to be picked
    when the body names none; ``field`` names the body's inputs in a too-large error."""

    capability: ClassVar[Capability] = "embed"
    field: ClassVar[str] = "input"

    def count(self, body: B) -> int:
        """How many inputs the body holds (held to --max-client-batch-size)."""
        raise NotImplementedError

    def named(self, body: B) -> str:
        """The body's field that holds the inputs, for a too-large error."""
        return self.field

    def pick(self, body: B) -> Capability:
        """What the served model must do for this body (a media body: its tower)."""
        return self.capability

    def decode(self, body: B, engine: Engine) -> Q:
        """The engine request the body asks for (``engine``: the model it goes to, for the
        fields whose meaning depends on it, as Cohere's ``input_type`` picks a prompt)."""
        raise NotImplementedError

    async def call(self, engine: Engine, request: Q) -> Result:
        """The engine call; ``result.output`` is the typed value ``encode`` reads."""
        return await call_engine(engine, request)

    def encode(self, body: B, engine: Engine, result: Result) -> Any:
        """The answer, a response model of the dialect's (built with ``of``); its return
        annotation is the route's documented 200 body."""
        raise NotImplementedError


async def call_engine(engine: Engine, request: Any) -> Result:
    """The engine call a request type names."""
    if isinstance(request, EmbedRequest):
        return await engine.embed(request)
    if isinstance(request, RerankRequest):
        return await engine.rerank(request)
    assert isinstance(request, ClassifyRequest)
    _, result = await engine.classify(request)
    return result


def as_list(value: Any) -> list:
    """One input or a list of them, as a list."""
    return [value] if isinstance(value, str) else list(value)


def classify_request(texts: list[str], body: Any, raw_scores: bool = False) -> ClassifyRequest:
    """A classify body's texts with its ``raw_scores`` (or ``raw_scores`` forced) and
    ``truncate``, as TEI's and Infinity's bodies both name them."""
    return ClassifyRequest(texts, raw_scores=raw_scores or body.raw_scores, truncate=body.truncate)


def usage(tokens: int) -> Usage:
    return of(Usage, prompt_tokens=tokens, total_tokens=tokens)


def label_rows(rows: list[list[dict]]) -> list[list[LabelScore]]:
    """A classifier's rows (``ember.outputs.Labels``) as typed label scores."""
    return [[of(LabelScore, label=s["label"], score=s["score"]) for s in row] for row in rows]
