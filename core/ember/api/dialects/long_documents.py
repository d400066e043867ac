"""The long-document fields every embed body takes (OpenAI's through ``extra_body``,
Cohere's, TEI's, Infinity's and vLLM's ``/v1/embeddings``) and the ``chunks`` every embed
answer gains: one shape on every route, decoded into ``ember.chunking.Chunking``."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from ember.api.dialects import of
from ember.api.schemas import PositiveInt, StrictBool, StrictInt, _Body
from ember.chunking import Chunking, chunking_of
from ember.outputs import ChunkedVectors, to_base64


class ChunkingOptions(BaseModel):
    """How to cut each input into chunks."""

    size: PositiveInt | None = Field(
        None,
        description="Tokens per chunk (the input's own, special tokens and prompt not "
        "counted); default: as many as the model takes.",
    )
    overlap: StrictInt = Field(0, ge=0, description="Tokens a chunk repeats of the one before.")
    boundary: Literal["token", "sentence"] = Field(
        "token",
        description="token: cut between words; sentence: where a sentence ends within the "
        "chunk's room, else between words.",
    )
    return_text: StrictBool = Field(False, description="Each chunk's text in `chunks[].text`.")


class LongDocumentFields(_Body):
    """Ember's long-document fields, the same on every embed route."""

    overflow: Literal["error", "truncate", "chunk"] | None = Field(
        None,
        description="An input past the model's length: 400 (error), cut (truncate, counted "
        "in the x-ember-truncated header), or chunked (chunk). Default: the route's own "
        "`truncate`.",
    )
    chunking: ChunkingOptions | None = Field(
        None, description="Cut every input into chunks; each answer item gains `chunks`."
    )
    late_chunking: StrictBool = Field(
        False,
        description="One forward over the whole document, each chunk pooled from its own "
        "token vectors (windows past the model's length). Without chunking: Jina's shape, "
        "the strings of the input are one document's chunks.",
    )
    aggregate: Literal["none", "mean", "max", "first"] | None = Field(
        None,
        description="The item's `embedding` when chunked: the chunks' mean weighted by their "
        "tokens (default), element-wise max, the first chunk's, or none (null).",
    )


def long_document_options(body: LongDocumentFields, truncate: bool) -> dict[str, Any]:
    """The body's ``truncate`` (``overflow`` error/truncate decide it when sent) and its
    ``Chunking``, as ``EmbedRequest`` fields."""
    options = body.chunking
    chunking = chunking_of(
        overflow=body.overflow,
        size=options.size if options else None,
        overlap=options.overlap if options else None,
        boundary=options.boundary if options else None,
        late=body.late_chunking,
        aggregate=body.aggregate,
        text=bool(options and options.return_text),
        chunked=options is not None,
    )
    if body.overflow in ("error", "truncate"):
        truncate = body.overflow == "truncate"
    return {"truncate": truncate, "chunking": chunking}


def wants_chunks(chunking: Chunking | None) -> bool:
    """Whether the answer carries ``chunks`` (Jina's shape answers one vector per string)."""
    return chunking is not None and not chunking.given


class ChunkItem(BaseModel):
    index: int
    embedding: list[float] | str = Field(description="base64: little-endian float32 bytes.")
    char_start: int = Field(description="Unicode code points of the input as sent.")
    char_end: int
    token_start: int = Field(description="The input's own tokens (no special tokens, no prompt).")
    token_end: int
    text: str | None = None


def chunk_places(output: ChunkedVectors, item: int) -> list[dict[str, Any]]:
    """Input ``item``'s chunks as answer fields, their vectors left to the dialect: index,
    offsets and (when asked) text."""
    texts = output.texts[item] if output.texts is not None else None
    out = []
    for k, span in enumerate(output.spans[item]):
        fields: dict[str, Any] = dict(
            index=k,
            char_start=span.char_start,
            char_end=span.char_end,
            token_start=span.token_start,
            token_end=span.token_end,
        )
        if texts is not None:
            fields["text"] = texts[k]
        out.append(fields)
    return out


def chunk_items(output: ChunkedVectors, item: int, base64: bool) -> list[ChunkItem]:
    """Input ``item``'s chunks as answer items."""
    vectors: np.ndarray = output.chunks[item]
    return [
        of(ChunkItem, embedding=to_base64(vectors[k]) if base64 else vectors[k], **fields)
        for k, fields in enumerate(chunk_places(output, item))
    ]


def document_vectors(output: ChunkedVectors, base64: bool) -> list[Any]:
    """Each input's ``embedding`` when chunked: its aggregate (None: none asked)."""
    if output.documents is None:
        return [None] * len(output.chunks)
    if base64:
        return [to_base64(v) for v in output.documents]
    return list(output.documents)
