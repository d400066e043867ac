"""Processors: one request item -> model features plus a cost, and a batch -> one input.

Text models get ``TextTokenizer`` (``ColbertTokenizer`` adds ColBERT's query and document
encodings; static models get it without special tokens, and a sentence-transformers Router
``RouterProcessor``, each route's own); media models (CLIP, SigLIP, CLAP, ColPali, ColQwen2)
get ``MediaProcessor``, which runs the model's own transformers processor for text, images
and audio. Every processor has the same shape: ``encode`` items into features with a
``cost`` and a shape ``key``, ``collate`` a batch of them for the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ember.backends.base import TokenBatch
from ember.models.spec import ResolvedModel
from ember.processors.text import Direction, TextTokenizer, Tokens


class TextProcessor(Protocol):
    max_length: int
    encodes_queries: bool  # whether ``query`` changes the encoding
    masks_positions: bool  # whether it returns positions masked from attention
    # Whether a "query"/"document" prompt_name is also applied as the model's prompt of
    # that name (sentence-transformers' Router) or only picks the side (PyLate's ColBERT).
    side_prompts: bool

    def encode(
        self,
        texts: list[str],
        *,
        truncate: bool = True,
        direction: Direction = "right",
        query: bool | None = False,
    ) -> list[Tokens]: ...

    def encode_pairs(
        self, pairs: list[tuple[str, str]], *, truncate: bool = True
    ) -> list[Tokens]: ...

    def from_ids(
        self, sequences: list[list[int]], *, truncate: bool = True, query: bool | None = False
    ) -> list[Tokens]: ...

    def collate(self, tokens: Sequence[Tokens]) -> TokenBatch: ...

    def filler(self, length: int) -> Tokens: ...

    def tokenize_detail(self, text: str, *, add_special_tokens: bool = True) -> list[dict]: ...

    def decode(self, ids: list[list[int]], *, skip_special_tokens: bool = True) -> list[str]: ...


def build_processor(model: ResolvedModel, max_length: int | None = None) -> TextProcessor:
    """The processor the model's kind names in the capability table."""
    assert model.kind is not None
    if model.kind.processor == "media":
        from ember.processors.media import build_media_processor

        return build_media_processor(model, max_length)  # type: ignore[return-value]
    if model.kind.processor == "colbert-text":
        from ember.processors.colbert import ColbertTokenizer

        return ColbertTokenizer(model, max_length)
    if model.kind.processor == "llm-rerank":
        from ember.processors.llm_rerank import LlmRerankTokenizer

        return LlmRerankTokenizer(model, max_length)
    if model.kind.processor == "router":
        from ember.processors.router import RouterProcessor

        return RouterProcessor(model, max_length)
    return TextTokenizer(model, max_length, special_tokens=model.kind.processor != "static-text")
