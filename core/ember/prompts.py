"""Which of a model's prompts a side of retrieval goes by.

Cohere's ``input_type`` and the embedded ``query=True``/``False`` both name a side; a model
names its prompts its own way (e5's "query"/"passage", nomic's "search_query", jina-v3's
"retrieval.query"). One table maps the side to the names to try, so the HTTP routes and
``Engine.embed`` pick the same prompt, as sentence-transformers' ``encode_query`` and
``encode_document`` do.
"""

from __future__ import annotations

from collections.abc import Mapping

# Cohere's input_type -> the model's prompt names to try, first found wins. The aliases
# are sentence-transformers' own (encode_query: "query"; encode_document: "document",
# "passage", "corpus") and jina-embeddings-v3's tasks (also its LoRA adapters); the Cohere
# name itself comes first for models that use it.
PROMPT_NAMES: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query", "retrieval.query"),
    "search_document": ("search_document", "document", "passage", "corpus", "retrieval.passage"),
    "classification": ("classification",),
    "clustering": ("clustering", "separation"),
}

# ``query=True``/``False`` (``Engine.embed``) as the input_type naming that side.
SIDE_INPUT_TYPES = {True: "search_query", False: "search_document"}


def prompt_for(input_type: str | None, prompts: Mapping[str, str]) -> str | None:
    """The model's prompt name for a Cohere ``input_type``, or None to use no named one
    (the engine then applies the model's default prompt, as sentence-transformers does)."""
    for name in PROMPT_NAMES.get(input_type or "", ()):
        if name in prompts:
            return name
    return None
