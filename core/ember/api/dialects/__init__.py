"""Each API dialect as a translator: ``decode(body) -> engine request`` and
``encode(result) -> body``.

One module per dialect (``openai``, ``cohere``, ``tei``, ``infinity``, ``vllm``,
``sagemaker``) holds what its bodies mean, one ``Translator`` per operation; the route
table wires each through ``ember.api.operations.run``: count the inputs against
--max-client-batch-size, pick the model, decode, call the engine, encode. What every
dialect shares — ``dimensions`` 0 as the full size, the Matryoshka range, the model's
checks — is decided once, in the request (``ember.engine.requests``), not here.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

from ember.capabilities import Capability
from ember.engine import Engine, Result
from ember.engine.requests import ClassifyRequest, EmbedRequest, RerankRequest

B = TypeVar("B")  # the dialect's body
Q = TypeVar("Q")  # the engine request it decodes to


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
        """The answer's body, as the dialect's clients read it (orjson serialises it)."""
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


def usage(tokens: int) -> dict[str, int]:
    return {"prompt_tokens": tokens, "total_tokens": tokens}
