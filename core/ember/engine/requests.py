"""Typed engine requests: one frozen value per engine call (embed, rerank, classify).

Every dialect (OpenAI, Cohere, TEI, Infinity, vLLM, the platforms' ``/invocations``, the
embedded API) decodes its body into one of these; the engine validates it once against the
served model (``EmbedRequest.validated``) and the embedding cache keys on its options.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ember.capabilities import Modality, Output
from ember.chunking import Chunking
from ember.errors import BadRequest
from ember.models.score_activation import RerankScale
from ember.outputs import embeds, output_type
from ember.prompts import SIDE_INPUT_TYPES, prompt_for

if TYPE_CHECKING:
    from ember.models.spec import ResolvedModel
    from ember.processors.text import Direction


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """Embeddings of ``output`` kind (None: the model's first). ``query`` asks for
    query-side (True) or document-side (False) encoding where a model has sides (ColBERT's
    markers and expansion, a Router's routes); None: neither said. ``modality`` image or
    audio: ``inputs`` are URLs, data: URIs or raw bytes. ``max_tokens`` (vLLM's
    ``truncate_prompt_tokens``, -1: the model's max) cuts each input to that many tokens
    from ``truncation_direction``, special tokens included. ``dimensions`` 0 means the full
    size (as Infinity means it), like None; ``dimensions_param`` is the caller's name for
    it (Cohere's ``output_dimension``), for the one range check's error. ``chunking``: each
    input cut into chunks, embedded and aggregated (``ember.chunking``); None: whole."""

    inputs: Sequence[Any]
    output: Output | None = None
    normalize: bool | None = None
    dimensions: int | None = None
    truncate: bool = True
    truncation_direction: Direction = "right"
    prompt_name: str | None = None
    query: bool | None = None
    modality: Modality = "text"
    max_tokens: int | None = None
    dimensions_param: str = "dimensions"
    chunking: Chunking | None = None

    def __post_init__(self) -> None:
        if self.dimensions == 0:
            object.__setattr__(self, "dimensions", None)

    def options(self) -> dict[str, Any]:
        """Every field but the inputs: what changes an output (the cache key's part)."""
        return {
            "output": self.output,
            "normalize": self.normalize,
            "dimensions": self.dimensions,
            "truncate": self.truncate,
            "truncation_direction": self.truncation_direction,
            "prompt_name": self.prompt_name,
            "query": self.query,
            "modality": self.modality,
            "max_tokens": self.max_tokens,
            "dimensions_param": self.dimensions_param,  # changes only an error's words
            "chunking": self.chunking,
        }

    def validated(self, model: ResolvedModel, name: str) -> EmbedRequest:
        """This request against the served model: its output resolved (the model's first
        embedding by default), the side's prompt taken where none is named (as
        ``input_type`` does on the routes: sentence-transformers' ``encode_query``), and
        what the model cannot do refused before any compute."""
        family = model.family
        output = self.output or family.embedding
        if output is None or not embeds(output):
            raise BadRequest(
                f"model {name!r} ({family.name}) does not embed; it serves {family.serves()}",
                param="model",
            )
        family.require_output(output, name)
        if self.dimensions is not None:
            output_type(output).check_dimensions(
                self.dimensions, model.hidden_size, name, self.dimensions_param
            )
        if self.modality != "text":
            family.require_modality(self.modality, name)
            if self.max_tokens is not None:
                raise BadRequest(
                    f"truncate_prompt_tokens is for text; modality {self.modality} has no tokens",
                    param="truncate_prompt_tokens",
                )
        prompt_name = self.prompt_name
        if prompt_name is None and self.query is not None and self.modality == "text":
            prompt_name = prompt_for(SIDE_INPUT_TYPES[self.query], model.prompts)
        if output == self.output and prompt_name == self.prompt_name:
            return self
        return replace(self, output=output, prompt_name=prompt_name)


@dataclass(frozen=True, slots=True)
class RerankRequest:
    """One score per document against ``query``: ``raw_scores`` skips the activation,
    ``modality`` says what the documents are (page images for ColPali; the query is text),
    ``instruction`` replaces an LLM reranker's own, ``scale`` is the caller's dialect
    (``served_activation``). ``max_tokens_per_doc`` / ``max_chunks_per_doc`` (Cohere's
    names, either one): each document cut into chunks of at most that many of its own
    tokens (None: what fits beside the query), at most that many chunks, its score the best
    chunk's (``ember.engine.long_rerank``)."""

    query: str
    documents: Sequence[str]
    raw_scores: bool = False
    truncate: bool = True
    modality: Modality = "text"
    instruction: str | None = None
    scale: RerankScale = "saved"
    max_tokens_per_doc: int | None = None
    max_chunks_per_doc: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_tokens_per_doc", "max_chunks_per_doc"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise BadRequest(f"{name} must be at least 1, got {value}", param=name)

    @property
    def chunked(self) -> bool:
        """Whether long documents are scored by their chunks."""
        return self.max_tokens_per_doc is not None or self.max_chunks_per_doc is not None


@dataclass(frozen=True, slots=True)
class ClassifyRequest:
    """Every label's score per text, best first (``raw_scores``: the logits)."""

    texts: Sequence[str]
    raw_scores: bool = False
    truncate: bool = True
