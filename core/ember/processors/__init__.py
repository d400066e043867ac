"""Processors: one request item -> model features plus a cost, and a batch -> one input.

Text models get ``TextTokenizer`` (static models without special tokens); media models
(CLIP, SigLIP, CLAP, ColPali, ColQwen2) get ``MediaProcessor``, which runs the model's own
transformers processor for text, images and audio. A family whose inputs are encoded its
own way has its processor in its package (``ember.families.<name>``: ColBERT's markers,
the LLM prompts, a Router's routes), named by its row's ``processor`` hook. Every
processor has the same shape: ``encode`` items into features with a ``cost`` and a shape
``key``, ``collate`` a batch of them for the backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ember.batch import TokenBatch, Tokens
from ember.models.spec import ResolvedModel
from ember.processors.text import Direction


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
    """The processor the model's family builds (``Family.processor``)."""
    return model.family.processor(model, max_length)
