"""Request bodies of the OpenAI-, Cohere- and TEI-compatible routes.

Responses are plain dicts serialised by orjson (numpy arrays included); their shapes are
described for the OpenAPI schema in ``ember.api.responses``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from ember.families.registry import INSTRUCTIONS

NonEmptyText = Annotated[str, Field(min_length=1)]
# true or false only: pydantic's lax bool would take 0, 1, "yes" or "off" for a flag.
StrictBool = Annotated[bool, Strict()]
# An integer only: the lax int would take true as 1, "3" as 3 and 2.0 as 2.
StrictInt = Annotated[int, Strict()]
# Cohere's input types; a model's own prompts (``query``, ``document``...) are chosen by them.
InputType = Literal["search_query", "search_document", "classification", "clustering"]
Modality = Literal["text", "image", "audio"]
MediaItem = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]


class _Body(BaseModel):
    # Clients send fields we do not use (OpenAI's `user`, Cohere's `max_chunks_per_doc`).
    model_config = ConfigDict(extra="ignore")


class EmbeddingsRequest(_Body):
    """OpenAI ``POST /v1/embeddings``."""

    input: (
        NonEmptyText
        | Annotated[list[NonEmptyText], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    ) = Field(
        description="A string, a list of strings, token ids, or a list of token-id lists.",
        # The members take disjoint JSON, so the first that fits is the answer; pydantic's
        # default "smart" mode tries every member: 9.7 against 2.8 us for 32 strings.
        union_mode="left_to_right",
    )
    model: str | None = Field(None, description="Served model name; any name with one model.")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: little-endian float32 bytes."
    )
    dimensions: StrictInt | None = Field(
        None,
        description="Matryoshka: keep the first N values, then re-normalise; 0 or null: all "
        "(Infinity's client sends 0).",
    )
    user: str | None = None
    modality: Modality = Field(
        "text",
        description="Infinity's field: what `input` holds. image or audio: each item is an "
        "http(s) URL or a data: URI with base64 content, for a model that takes them.",
    )
    truncate: StrictBool = Field(
        True, description="Cut text past the model's max tokens (else 400)."
    )
    input_type: InputType | None = Field(
        None,
        description="Cohere's field: search_query encodes queries (ColBERT markers and "
        "expansion, the model's query prompt); default: documents.",
    )
    truncate_prompt_tokens: StrictInt | None = Field(
        None,
        description="vLLM's field: keep each input's last k tokens (left truncation), the "
        "model's special tokens counted and kept; -1: the model's max length; past it, 400.",
    )


class MediaEmbeddingsRequest(_Body):
    """Infinity's legacy ``POST /embeddings_image`` and ``/embeddings_audio``."""

    input: MediaItem | Annotated[list[MediaItem], Field(min_length=1)] = Field(
        description="An http(s) URL or a data: URI with base64 content, or a list of them."
    )
    model: str | None = Field(None, description="Served model name; any name with one model.")
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: str | None = None


INSTRUCTION = (
    f"An LLM reranker's instruction for this request ({INSTRUCTIONS}), in place of the "
    "model's (--instruction, else its card's); 400 for other models."
)


class RerankDocument(_Body):
    text: NonEmptyText


class RerankRequest(_Body):
    """Cohere's ``POST /v1/rerank`` and ``/v2/rerank`` body, and Infinity's ``/rerank``."""

    query: NonEmptyText
    documents: Annotated[list[NonEmptyText | RerankDocument], Field(min_length=1)]
    model: str | None = None
    top_n: StrictInt | None = Field(None, ge=1, description="Return only the best N.")
    return_documents: StrictBool = False
    raw_scores: StrictBool = Field(False, description="Logits instead of sigmoid scores.")
    truncate: StrictBool = True
    instruction: NonEmptyText | None = Field(None, description=INSTRUCTION)
    modality: Literal["text", "image"] = Field(
        "text",
        description="What `documents` hold: image for page images (URLs or data: URIs) "
        "scored by MaxSim against the text query (ColPali, ColQwen2).",
    )


class TEIRerankRequest(_Body):
    """TEI ``POST /rerank``: told apart from Cohere's body by ``texts``."""

    query: NonEmptyText
    texts: Annotated[list[NonEmptyText], Field(min_length=1)]
    top_n: StrictInt | None = Field(
        None, ge=1, description="Return only the best N (LiteLLM's huggingface/ sends it)."
    )
    return_text: StrictBool = False
    raw_scores: StrictBool = False
    truncate: StrictBool = True
    model: str | None = None
    instruction: NonEmptyText | None = Field(None, description=INSTRUCTION)


class ClassifyRequest(_Body):
    """``POST /classify`` (Infinity-style)."""

    input: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    model: str | None = None
    raw_scores: StrictBool = False
    truncate: StrictBool = True


class TEIPredictRequest(_Body):
    """TEI ``POST /predict``."""

    inputs: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    raw_scores: StrictBool = False
    truncate: StrictBool = True
    model: str | None = None


class TEIEmbedRequest(_Body):
    """TEI ``POST /embed``."""

    inputs: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    normalize: StrictBool = True
    truncate: StrictBool = True
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    prompt_name: str | None = None
    dimensions: StrictInt | None = None
    model: str | None = None


class TEIEmbedOutputRequest(_Body):
    """TEI ``POST /embed_sparse`` and ``/embed_all``."""

    inputs: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    truncate: StrictBool = True
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    prompt_name: str | None = Field(
        None, description="A prompt of the model's; on ColBERT models `query` or `document`."
    )
    model: str | None = None


class TEITokenizeRequest(_Body):
    """TEI ``POST /tokenize``."""

    inputs: NonEmptyText | Annotated[list[NonEmptyText], Field(min_length=1)]
    add_special_tokens: StrictBool = True
    prompt_name: str | None = None
    model: str | None = None
