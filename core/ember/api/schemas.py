"""The field types every dialect's request bodies share: strict flags and integers,
non-empty texts, token ids. Each dialect's bodies and answers live in its own module
(``ember.api.dialects``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

from ember.families.registry import INSTRUCTIONS
from ember.models.catalogue import duration_seconds

NonEmptyText = Annotated[str, Field(min_length=1)]
# true or false only: pydantic's lax bool would take 0, 1, "yes" or "off" for a flag.
StrictBool = Annotated[bool, Strict()]


def _integral(value: Any) -> Any:
    """2.0 as 2: JSON Schema's ``integer`` is any number with no fractional part (as
    pydantic's lax int, Infinity's and vLLM's, reads it); 2.5 stays a float, refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer: the lax int would also take true as 1 and "3" as 3. Bounds go before the
# validator (``PositiveInt``), where the schema shows them as ``minimum``/``maximum``.
StrictInt = Annotated[int, Strict(), BeforeValidator(_integral)]
PositiveInt = Annotated[int, Strict(), Field(ge=1), BeforeValidator(_integral)]
# Cohere's input types; a model's own prompts (``query``, ``document``...) are chosen by them.
InputType = Literal["search_query", "search_document", "classification", "clustering"]
Modality = Literal["text", "image", "audio"]
MediaItem = Annotated[str, Field(min_length=1)]
# TEI's ids are u32: past that, no vocabulary has the id.
TokenId = Annotated[int, Strict(), Field(ge=0, le=2**32 - 1), BeforeValidator(_integral)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


def _duration(value: Any) -> Any:
    """A ``keep_alive`` string as seconds (one that is no duration: 422); true or false is
    no duration either (the lax float would read them as 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError("keep_alive is seconds or a duration such as '5m', not true or false")
    return duration_seconds(value) if isinstance(value, str) else value


# Ollama's keep_alive: seconds (negative: forever) or a duration string ("5m", "1h30m").
KeepAlive = Annotated[
    float | None,
    BeforeValidator(_duration),
    Field(
        description="Ollama's field: how long the model stays loaded after this request "
        '(seconds, or a duration such as "5m"; 0 unloads it at once, negative keeps it '
        "until evicted); default: the model's idle_unload. Pinned models stay regardless."
    ),
]


class _Part(BaseModel):
    """A part of a body (a document, a parameters object)."""

    # Clients send fields we do not use (OpenAI's `user`, Cohere's `max_chunks_per_doc`).
    model_config = ConfigDict(extra="ignore")


class _Body(_Part):
    """A route's body: every route takes a priority lane claim (``ember.lanes``) and
    Ollama's ``keep_alive`` (models on demand)."""

    keep_alive: KeepAlive = None

    priority: StrictInt | None = Field(
        None,
        description="vLLM's field: lower is sooner; below 0 the interactive lane, 0 the "
        "default lane, above 0 bulk. The API key's ceiling caps what it may claim.",
    )
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None,
        description="OpenAI's field (before `priority`): priority is the interactive lane, "
        "default or auto the default lane, flex bulk. The served tier is echoed.",
    )


INSTRUCTION = (
    f"An LLM reranker's instruction for this request ({INSTRUCTIONS}), in place of the "
    "model's (--instruction, else its card's); 400 for other models."
)
