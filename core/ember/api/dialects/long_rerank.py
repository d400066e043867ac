"""Long documents on the rerank routes: the fields every rerank body takes (Cohere's
``max_tokens_per_doc`` and ``max_chunks_per_doc``, on Cohere's, Infinity's, TEI's and vLLM's
bodies alike) and the ``chunk`` every answer item then gains: where the chunk that gave
the document its score lies (``ember.engine.long_rerank``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from ember.api.dialects import of
from ember.api.schemas import PositiveInt, _Body
from ember.outputs import ChunkedScores, Scores


class LongRerankFields(_Body):
    """The long-document fields, the same on every rerank body."""

    max_tokens_per_doc: PositiveInt | None = Field(
        None,
        description="Cut each document into chunks of at most this many of its own tokens "
        "(at most what fits beside the query; between words), score each chunk with the "
        "query, and answer the best chunk's score; each result gains `chunk`.",
    )
    max_chunks_per_doc: PositiveInt | None = Field(
        None,
        description="Score at most this many chunks of a document, its first ones (the rest "
        "is cut, counted in x-ember-truncated; with truncate=false, 400). Alone: chunks of "
        "what fits beside the query.",
    )

    def chunking(self) -> dict[str, Any]:
        """The fields as ``RerankRequest`` takes them."""
        return {
            "max_tokens_per_doc": self.max_tokens_per_doc,
            "max_chunks_per_doc": self.max_chunks_per_doc,
        }


class RerankChunk(BaseModel):
    index: int = Field(description="The chunk's place among the document's chunks.")
    char_start: int = Field(description="Unicode code points of the document as sent.")
    char_end: int
    token_start: int = Field(description="The document's own tokens (no query, no special tokens).")
    token_end: int


def chunk_of(output: Scores, item: int) -> RerankChunk | None:
    """Where document ``item``'s best chunk lies (None: the documents were scored whole)."""
    if not isinstance(output, ChunkedScores):
        return None
    span = output.spans[item]
    return of(
        RerankChunk,
        index=output.best[item],
        char_start=span.char_start,
        char_end=span.char_end,
        token_start=span.token_start,
        token_end=span.token_end,
    )
