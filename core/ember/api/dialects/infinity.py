"""Infinity's own routes: ``/embeddings_image`` and ``/embeddings_audio`` (``/v1/embeddings``
with the modality in the path), ``/rerank`` with Cohere's body (``document`` a string) and
``/classify``; its ``/v1/embeddings`` fields are OpenAI's body's (``ember.api.dialects.openai``)."""

from __future__ import annotations

from typing import Any

from ember.api import schemas as s
from ember.api.dialects import Translator, as_list, classify_request, cohere
from ember.api.dialects.openai import MODALITY_CAPABILITY, check_base64_dtype, embeddings_body
from ember.capabilities import Capability, Modality
from ember.engine import Engine, Result
from ember.engine.requests import ClassifyRequest, EmbedRequest
from ember.outputs import Labels


class MediaEmbeddings(Translator[s.MediaEmbeddingsRequest, EmbedRequest]):
    """``/embeddings_image``, ``/embeddings_audio``: OpenAI's answer."""

    def __init__(self, modality: Modality) -> None:
        self.modality = modality

    def count(self, body: s.MediaEmbeddingsRequest) -> int:
        return len(as_list(body.input))

    def pick(self, body: s.MediaEmbeddingsRequest) -> Capability:
        return MODALITY_CAPABILITY[self.modality]

    def decode(self, body: s.MediaEmbeddingsRequest, engine: Engine) -> EmbedRequest:
        check_base64_dtype(engine, body.encoding_format == "base64")
        return EmbedRequest(as_list(body.input), dimensions=body.dimensions, modality=self.modality)

    def encode(self, body: s.MediaEmbeddingsRequest, engine: Engine, result: Result) -> Any:
        return embeddings_body(engine, result, body.encoding_format == "base64")


class Rerank(cohere.Rerank):
    """Infinity's ``/rerank``: Cohere's frame, ``document`` the document string, null
    without ``return_documents`` (Infinity's clients, LiteLLM's ``infinity/``, read a
    string there)."""

    def document(self, text: str | None) -> dict[str, Any]:
        return {"document": text}


class Classify(Translator[s.ClassifyRequest, ClassifyRequest]):
    """``/classify``: every label's score per text, in Cohere's frame."""

    capability = "classify"

    def count(self, body: s.ClassifyRequest) -> int:
        return len(as_list(body.input))

    def decode(self, body: s.ClassifyRequest, engine: Engine) -> ClassifyRequest:
        return classify_request(as_list(body.input), body)

    def encode(self, body: s.ClassifyRequest, engine: Engine, result: Result) -> Any:
        assert isinstance(result.output, Labels)
        rows = result.output.rows
        return cohere.envelope("classify", "data", rows, engine.name, result.prompt_tokens)


EMBEDDINGS_IMAGE = MediaEmbeddings("image")
EMBEDDINGS_AUDIO = MediaEmbeddings("audio")
RERANK = Rerank()
CLASSIFY = Classify()
